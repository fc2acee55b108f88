#!/usr/bin/env python3
"""Writes the tiny chat SFT example: recipes/sft-tiny/data/chat.jsonl and the model directory's
text files recipes/sft-tiny/models/tiny/{tokenizer.json, tokenizer_config.json, config.json}.

  python3 tools/make_sft_tiny_data.py            (deterministic: same files on every run)

The data: ~300 short conversations in the "messages" format with patterns a 2-layer model can
visibly learn: arithmetic, capital cities, repeating and reversing words, counting; one to three
user/assistant turns, some with a system message.

The tokenizer: a byte-level BPE (GPT-2 style: ByteLevel pre-tokenizer and decoder, the 256 byte
symbols as ids 0-255) with merges learned here from the conversations rendered in ChatML, plus
the special tokens <|endoftext|>, <|im_start|> and <|im_end|>. tokenizer_config.json carries the
ChatML chat template, bos_token null and eos_token <|im_end|>. config.json is a llama-family model
(hidden 64, 2 layers) whose vocab_size is the tokenizer's rounded up to a multiple of 64.
model.safetensors is not written here.
"""
import collections
import json
import os
import random
import re

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DATA = os.path.join(ROOT, "recipes/sft-tiny/data/chat.jsonl")
MODEL = os.path.join(ROOT, "recipes/sft-tiny/models/tiny")
SEED = 20240726
NUM_CONVERSATIONS = 300
NUM_MERGES = 400
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Kenya", "Nairobi"),
    ("Peru", "Lima"), ("Norway", "Oslo"), ("Greece", "Athens"), ("Chile", "Santiago"),
    ("Poland", "Warsaw"), ("Cuba", "Havana"), ("Ireland", "Dublin"), ("Portugal", "Lisbon"),
]
WORDS = ["apple", "river", "green", "stone", "cloud", "tiger", "music", "light", "paper", "sun",
         "bread", "house", "water", "happy", "blue", "cat", "dog", "tree", "bird", "moon"]
SYSTEMS = ["You are a helpful assistant.", "You are a concise assistant. Answer briefly."]


def turn_arithmetic(rng):
    a, b = rng.randint(0, 20), rng.randint(0, 20)
    op = rng.choice(["+", "-", "*"])
    value = a + b if op == "+" else a - b if op == "-" else a * b
    q = rng.choice(["What is {a} {op} {b}?", "Compute {a} {op} {b}.", "{a} {op} {b} = ?"]).format(a=a, op=op, b=b)
    return q, f"{a} {op} {b} = {value}."


def turn_capital(rng):
    country, city = rng.choice(CAPITALS)
    q = rng.choice(["What is the capital of {c}?", "Name the capital city of {c}."]).format(c=country)
    return q, f"The capital of {country} is {city}."


def turn_repeat(rng):
    words = rng.sample(WORDS, rng.randint(2, 4))
    return "Repeat: " + " ".join(words), " ".join(words)


def turn_reverse(rng):
    words = rng.sample(WORDS, rng.randint(2, 4))
    return "Reverse the words: " + " ".join(words), " ".join(reversed(words))


def turn_count(rng):
    n = rng.randint(2, 6)
    word = rng.choice(WORDS)
    return f"Say {word} {n} times.", " ".join([word] * n)


TURNS = [turn_arithmetic, turn_capital, turn_repeat, turn_reverse, turn_count]


def conversations(rng):
    out = []
    for _ in range(NUM_CONVERSATIONS):
        messages = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
        for _ in range(rng.choice([1, 1, 2, 2, 3])):
            q, a = rng.choice(TURNS)(rng)
            messages.append({"role": "user", "content": q})
            messages.append({"role": "assistant", "content": a})
        out.append({"messages": messages})
    return out


def bytes_to_unicode():
    """GPT-2's map from the 256 bytes to printable characters (what ByteLevel works on)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


# An ASCII approximation of the GPT-2 split, used only to count words for learning merges (any
# merge is valid; the tokenizer itself splits with ByteLevel's own regex).
WORD_RE = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def learn_merges(texts, byte_map, num_merges):
    words = collections.Counter()
    for text in texts:
        for piece in WORD_RE.findall(text):
            words[tuple(byte_map[b] for b in piece.encode("utf-8"))] += 1
    words = dict(words)
    merges = []
    for _ in range(num_merges):
        pairs = collections.Counter()
        for w, f in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += f
        if not pairs:
            break
        best_count = max(pairs.values())
        if best_count < 2:
            break
        best = min(p for p, c in pairs.items() if c == best_count)  # ties: the smallest pair, deterministic
        merges.append(best)
        merged = {}
        for w, f in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + f
        words = merged
    return merges


def chatml(messages):
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def main():
    rng = random.Random(SEED)
    convs = conversations(rng)
    write(DATA, "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in convs))

    byte_map = bytes_to_unicode()
    # merges learn from the text between special tokens, as the tokenizer will see it
    texts = []
    for c in convs:
        texts += [t for t in re.split(r"<\|im_start\|>|<\|im_end\|>", chatml(c["messages"])) if t]
    merges = learn_merges(texts, byte_map, NUM_MERGES)
    vocab = {byte_map[b]: b for b in range(256)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = []
    for s in SPECIALS:
        added.append({"id": len(vocab) + len(added), "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    vocab_size = len(vocab) + len(added)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": dict(byte_level, trim_offsets=False),
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    write(os.path.join(MODEL, "tokenizer.json"), json.dumps(tokenizer, ensure_ascii=False, indent=1) + "\n")
    ids = {t["content"]: t["id"] for t in added}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 512,
        "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added},
        "chat_template": CHAT_TEMPLATE,
    }
    write(os.path.join(MODEL, "tokenizer_config.json"), json.dumps(config, ensure_ascii=False, indent=2) + "\n")
    model_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": (vocab_size + 63) // 64 * 64,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "bos_token_id": None,
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "torch_dtype": "bfloat16",
    }
    write(os.path.join(MODEL, "config.json"), json.dumps(model_config, indent=2) + "\n")
    print(f"{DATA}: {len(convs)} conversations; tokenizer: {len(merges)} merges, {vocab_size} ids "
          f"(model vocab_size {model_config['vocab_size']})")


if __name__ == "__main__":
    main()
