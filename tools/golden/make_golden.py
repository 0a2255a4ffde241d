#!/usr/bin/env python3
"""Writes Braid's golden reference files from Hugging Face transformers running the same GGUF.

tests/golden/tokenize.jsonl  {"text", "ids", "decoded"} per corpus string (special tokens parsed)
tests/golden/logits.jsonl    {"name", "text", "ids", "top_ids", "top_logits", "greedy",
                              "greedy_margins", "greedy_text"} per prompt: top-20 logits at every
                              prompt position, then 32 greedy tokens with the top1-top2 margin of each
tests/golden/meta.json       versions, model hash, how the files were made

transformers de-quantizes the GGUF to fp32 and un-permutes Q/K to its half-split RoPE layout, so it
is an independent implementation of the same weights. Nothing is fetched from a hub.
"""
import argparse
import datetime
import hashlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
import gguf  # noqa: E402
from tokenizers import pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

TOP_K = 20
GREEDY_TOKENS = 32

CORPUS = [
    "", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n\n", "  \n\t ", " leading space", "trailing space ",
    "multiple   spaces   between", "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "don't can't won't it's we've they're I'm you'll he'd", "I'LL DON'T WE'VE", "'s 't 're", "rock'n'roll",
    "Café résumé naïve coöperate façade", "e\u0301 combining acute, n\u0303 tilde", "Ångström Øresund Æther ß straße",
    "中文分词测试：今天天气很好。", "日本語のテキストとカタカナ、ひらがな。", "한국어 텍스트 처리", "Привет, мир! Съешь ещё этих булок.",
    "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Tiếng Việt có dấu",
    "emoji 😀😃😄 and 🙂", "family 👨‍👩‍👧‍👦 zwj", "flags 🇫🇷🇯🇵🇺🇸", "skin tones 👍🏽👋🏿", "math ∑∫√∞ ≤≥≠ ±×÷",
    "0", "7", "42", "123", "1234567890", "3.14159", "1,234,567", "-0.001e+10", "v1.2.3", "2026-11-22 10:24:06",
    "$1,000.00 and 50%", "phone +1 (555) 123-4567", "x1 y22 z333 w4444",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}",
    "{\"key\": [1, 2, {\"nested\": null}], \"ok\": true}", "for f in *.txt; do echo \"$f\" | wc -c; done",
    "^(?:[a-z0-9._%+-]+)@[a-z0-9.-]+\\.[a-z]{2,}$", "x = a->b ? c[i++] : *d; // comment", "SELECT * FROM t WHERE id >= 10;",
    "https://example.com/path/to/page?query=1&lang=en#section", "mailto:someone@example.org", "ftp://files.example.net/a_b-c.tar.gz",
    "!!!???...;;;:::", "--- *** ___ ~~~", "(([[{{<<>>}}]]))", "«quotes» “curly” ‘single’ „low“",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n",
    "abc<|im_end|>def", "<|im_start|><|im_end|><|endoftext|>", "<|im_startx|>", "< |im_end| >", "<|im_start", "text <|endoftext|> more",
    "<repo_name>braid<file_sep>main.c", "Mixed 中文 and English 123 with emoji 🚀!",
    "A long sentence that goes on and on, with commas, semicolons; colons: and — dashes – of several kinds.",
    "tabs\tinside\ttext\tand\ttrailing\t", "line1\nline2\n\nline4\r\nline5", "\u00a0non-breaking\u00a0spaces\u2003em\u2009thin",
    "zero\u200bwidth\u200cjoiners\u200d", "ÀÁÂÃÄÅàáâãäå", "ﬁ ligature ﬂ", "Ⅻ roman numeral ½ fraction ² superscript",
]

PROMPTS = [
    ("france_chat", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"),
    ("short_story", "Once upon a time, in a small village by the sea, there lived an old fisherman who"),
    ("facts", "The Eiffel Tower is located in Paris. It was completed in 1889 and"),
    ("code_short", "def factorial(n):\n    \"\"\"Return n!\"\"\"\n    if n <= 1:\n        return 1\n"),
    ("prose_long",
     "The history of computing is a story of layered abstractions. Early machines were programmed by rewiring "
     "panels and flipping switches, and every program was tied to the physical structure of the hardware that ran it. "
     "The stored-program concept changed that: instructions became data, kept in the same memory as the numbers they "
     "manipulated, and a machine could load a new program as easily as it loaded a new table of values. Assemblers came "
     "next, replacing numeric opcodes with mnemonics, and then compilers, which let programmers describe computations in "
     "notations closer to mathematics. Operating systems took over the chores of scheduling jobs and managing devices, "
     "and time-sharing let many people use one computer at once, each with the illusion of a private machine. Networks "
     "linked those machines together, first within a campus and then across continents, and the protocols that carried "
     "packets between them became the foundation of the internet. Personal computers put that power on desks and later "
     "in pockets, while data centers grew to hold hundreds of thousands of servers. Each layer hid the details of the one "
     "below it, so that people could build ever larger systems without understanding every transistor. Today, large "
     "language models add yet another layer, turning natural language into a kind of programming interface, and the "
     "engineering challenge has shifted once again toward memory, caching, and the careful reuse of expensive work."),
    ("code_long",
     "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\n"
     "/* A small hash map from strings to integers, with open addressing and linear probing. */\n"
     "typedef struct {\n    char **keys;\n    int *values;\n    size_t capacity;\n    size_t count;\n} HashMap;\n\n"
     "static unsigned long hash_string(const char *s) {\n    unsigned long h = 5381;\n    int c;\n"
     "    while ((c = *s++)) h = ((h << 5) + h) + (unsigned long)c;\n    return h;\n}\n\n"
     "HashMap *hashmap_create(size_t capacity) {\n    HashMap *m = calloc(1, sizeof *m);\n    if (!m) return NULL;\n"
     "    m->keys = calloc(capacity, sizeof *m->keys);\n    m->values = calloc(capacity, sizeof *m->values);\n"
     "    m->capacity = capacity;\n    return m;\n}\n\n"
     "int hashmap_put(HashMap *m, const char *key, int value) {\n    if (m->count * 2 >= m->capacity) return -1;\n"
     "    size_t i = hash_string(key) % m->capacity;\n    while (m->keys[i] && strcmp(m->keys[i], key) != 0)\n"
     "        i = (i + 1) % m->capacity;\n    if (!m->keys[i]) {\n        m->keys[i] = strdup(key);\n        m->count++;\n    }\n"
     "    m->values[i] = value;\n    return 0;\n}\n\n"
     "int hashmap_get(const HashMap *m, const char *key, int *value) {\n"),
    ("chat_multiturn",
     "<|im_start|>system\nYou are a careful assistant that explains technical topics clearly and briefly.<|im_end|>\n"
     "<|im_start|>user\nWhat is a key-value cache in a transformer model?<|im_end|>\n"
     "<|im_start|>assistant\nDuring generation, a transformer computes keys and values for every token it has seen. "
     "Instead of recomputing them for the whole sequence at each step, the model stores them in a cache and only "
     "computes the keys and values of the newest token. This makes each decoding step much cheaper.<|im_end|>\n"
     "<|im_start|>user\nWhy does the cache use so much memory?<|im_end|>\n"
     "<|im_start|>assistant\nThe cache holds one key and one value vector per token, per layer, per attention head. "
     "For long conversations and many concurrent users, that adds up to gigabytes, which is why serving systems "
     "page the cache into fixed-size blocks and share common prefixes between requests.<|im_end|>\n"
     "<|im_start|>user\nHow do agent workflows change that picture?<|im_end|>\n<|im_start|>assistant\n"),
    ("list_long",
     "Shopping list for the week:\n1. Apples (6)\n2. Bread, whole wheat\n3. Milk, 2 liters\n4. Eggs, a dozen\n"
     "5. Rice, 1 kg\n6. Tomatoes (8)\n7. Onions (4)\n8. Garlic\n9. Olive oil\n10. Cheese, cheddar\n11. Yogurt, plain\n"
     "12. Chicken breasts (4)\n13. Pasta, 500 g\n14. Coffee beans\n15. Bananas (6)\n16. Spinach\n17. Carrots (1 kg)\n"
     "18. Lentils\n19. Butter\n20. Honey\n21. Oats\n22. Black pepper\n23. Lemons (3)\n24. Potatoes (2 kg)\n"
     "25. Peppers, red and green\n26. Mushrooms\n27. Tea, green\n28. Chocolate, dark\n29. Flour\n30. Sugar\n"
     "Notes: check the pantry before leaving, and remember that the store closes at 9 pm on weekdays and 6 pm on Sundays. "
     "Total budget for this week is $85.50, which is"),
    ("unicode_mix", "Résumé: 東京 (Tokyo) → Париж (Paris) ✈️ on 2026-11-22; price €1.234,56. Notes:"),
]


def gguf_pre_tokenizer_name(path):
    reader = gguf.GGUFReader(path)
    field = reader.fields.get("tokenizer.ggml.pre")
    return field.contents() if field is not None else "default"


def install_named_pre_tokenizer(tok, name):
    """transformers' GGUF loader builds a plain GPT-2 ByteLevel pre-tokenizer whatever
    tokenizer.ggml.pre says. Install the one the file names, built from HF tokenizers' own
    components, as the model's original tokenizer.json configures it ("smollm": individual digits,
    then ByteLevel). Returns a description for meta.json."""
    if name == "smollm":
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        return "Sequence[Digits(individual_digits=True), ByteLevel] (installed for tokenizer.ggml.pre = smollm)"
    if name in ("default", "gpt2", "gpt-2"):
        return "ByteLevel (as transformers builds it)"
    raise SystemExit(f"make_golden: no reference pre-tokenizer mapping for tokenizer.ggml.pre = {name!r}")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_tokenize(tok, out):
    path = os.path.join(out, "tokenize.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for text in CORPUS:
            ids = tok.encode(text, add_special_tokens=False)
            decoded = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            f.write(json.dumps({"text": text, "ids": ids, "decoded": decoded}, ensure_ascii=False) + "\n")
    print(f"wrote {path}: {len(CORPUS)} strings")


@torch.no_grad()
def write_logits(tok, model, out):
    path = os.path.join(out, "logits.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for name, text in PROMPTS:
            ids = tok.encode(text, add_special_tokens=False)
            logits = model(torch.tensor([ids])).logits[0].float()
            top = torch.topk(logits, TOP_K, dim=-1)
            greedy, margins = [], []
            seq = list(ids)
            for _ in range(GREEDY_TOKENS):
                last = model(torch.tensor([seq])).logits[0, -1].float()
                two = torch.topk(last, 2)
                greedy.append(int(two.indices[0]))
                margins.append(float(two.values[0] - two.values[1]))
                seq.append(int(two.indices[0]))
            rec = {
                "name": name, "text": text, "ids": ids,
                "top_ids": top.indices.tolist(),
                "top_logits": [[float(f"{v:.7g}") for v in row] for row in top.values.tolist()],
                "greedy": greedy, "greedy_margins": [float(f"{m:.7g}") for m in margins],
                "greedy_text": tok.decode(greedy, skip_special_tokens=False),
            }
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            print(f"  {name}: {len(ids)} prompt tokens, min greedy margin {min(margins):.4g}, "
                  f"continuation {rec['greedy_text']!r}")
    print(f"wrote {path}: {len(PROMPTS)} prompts")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default="tests/golden")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model_dir, model_file = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=model_file)
    pre_name = gguf_pre_tokenizer_name(args.model)
    pre_description = install_named_pre_tokenizer(tok, pre_name)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=model_file, dtype=torch.float32)
    model.eval()
    os.makedirs(args.out, exist_ok=True)
    write_tokenize(tok, args.out)
    write_logits(tok, model, args.out)
    meta = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model_file": model_file, "model_sha256": sha256(args.model),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "gguf": getattr(gguf, "__version__", "unknown"), "python": sys.version.split()[0],
        "how": "tools/golden/make_golden.sh: transformers AutoTokenizer/AutoModelForCausalLM.from_pretrained(gguf_file=...), "
               "float32 on CPU; ids = tokenizer.encode(text, add_special_tokens=False); logits from one forward pass over "
               "the prompt; greedy tokens by argmax over the full sequence re-run each step",
        "pre_tokenizer": pre_description,
    }
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
