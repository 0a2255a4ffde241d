#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json) from a GGUF
file's own tokenizer, so Python benchmark tools (guidellm's --processor, anything that calls
AutoTokenizer.from_pretrained(DIR)) count tokens offline, without a model hub and without torch.

    gguf_tokenizer_json.py MODEL.gguf OUT_DIR

Supports the byte-level BPE tokenizers Braid serves (tokenizer.ggml.model "gpt2") with the
pre-tokenizers gpt2, smollm, llama3 / llama-bpe and qwen2 (the set src/model/pretokenize.c knows).
Control tokens (token type 3) become special added tokens, so chat-template markers stay whole.
Needs the PyPI packages gguf and tokenizers (transformers' own GGUF loader needs torch; this does not).
Exit status: 0; 1 on an unsupported tokenizer or an unreadable file.
"""
import json
import os
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

CONTROL_TOKEN_TYPE = 3
# The split expressions of the pre-tokenizers whose number rule differs from GPT-2's (public in
# the models' own tokenizer.json files): llama3 groups up to 3 digits, qwen2 splits single digits.
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def field(reader, key, default=None):
    """One scalar or string metadata value, or default when the key is absent."""
    f = reader.fields.get(key)
    return f.contents() if f is not None else default


def string_array(reader, key):
    f = reader.fields.get(key)
    if f is None:
        raise ValueError(f"{key} missing")
    return f.contents()


def pre_tokenizer_for(pre):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("gpt2", "default"):
        return byte_level
    if pre == "smollm":  # GPT-2's expression after splitting every digit on its own
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = {"llama3": LLAMA3_SPLIT, "llama-bpe": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT}.get(pre)
    if split is None:
        raise ValueError(f"pre-tokenizer '{pre}' is not supported (gpt2, smollm, llama3 / llama-bpe, qwen2 are)")
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def build(model_path):
    reader = GGUFReader(model_path)
    kind = field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"tokenizer model '{kind}' is not supported (gpt2 byte-level BPE is)")
    tokens = string_array(reader, "tokenizer.ggml.tokens")
    types = string_array(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in string_array(reader, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizer_for(field(reader, "tokenizer.ggml.pre", "default"))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [tokens[i] for i, t in enumerate(types) if int(t) == CONTROL_TOKEN_TYPE]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])

    def token_of(key):
        i = field(reader, key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token_of("tokenizer.ggml.bos_token_id"),
        "eos_token": token_of("tokenizer.ggml.eos_token_id"),
        "unk_token": token_of("tokenizer.ggml.unknown_token_id"),
        "pad_token": token_of("tokenizer.ggml.padding_token_id"),
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "model_max_length": int(field(reader, f"{field(reader, 'general.architecture')}.context_length", 2048)),
        "clean_up_tokenization_spaces": False,
    }
    template = field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return tok, {k: v for k, v in config.items() if v is not None}


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    model_path, out_dir = sys.argv[1], sys.argv[2]
    try:
        tok, config = build(model_path)
    except (OSError, ValueError) as e:
        print(f"gguf_tokenizer_json: {model_path}: {e}", file=sys.stderr)
        return 1
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
