#!/usr/bin/env python3
"""Writes the tiny preference example: recipes/dpo-tiny/data/pairs.jsonl.

  python3 tools/make_dpo_tiny_data.py            (deterministic: same file on every run)

Each line is {"prompt": [...messages], "chosen": "...", "rejected": "..."} for the bundled tiny
chat model (recipes/sft-tiny/models/tiny, whose tokenizer covers this text). The right answer is
learnable by a 2-layer model: the chosen reply repeats or reverses the word the user gave, states
the true capital, or the true result of a one-digit sum; the rejected reply has the same shape
with a different word, city or a sum off by one or two. Held-out pairs (data.eval_split) reuse the
facts with other phrasings and other wrong answers, so rewards/accuracies on them measures
what was learned, not the lines seen.
"""
import json
import os
import random

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "recipes/dpo-tiny/data/pairs.jsonl")
SEED = 20261124
NUM_PAIRS = 480

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Kenya", "Nairobi"),
    ("Peru", "Lima"), ("Norway", "Oslo"), ("Greece", "Athens"), ("Chile", "Santiago"),
]
WORDS = ["apple", "river", "green", "stone", "cloud", "tiger", "music", "light", "paper", "sun",
         "bread", "house", "water", "happy", "blue", "cat", "dog", "tree", "bird", "moon"]


def pair_repeat(rng):
    w, other = rng.sample(WORDS, 2)
    q = rng.choice(["Repeat the word {w}.", "Say {w} again.", "Echo: {w}"]).format(w=w)
    return q, f"{w}", f"{other}"


def pair_reverse(rng):
    w = rng.choice(WORDS)
    wrong = rng.choice([x for x in WORDS if x != w])
    q = rng.choice(["Reverse the word {w}.", "Spell {w} backwards."]).format(w=w)
    return q, w[::-1], wrong[::-1]


def pair_capital(rng):
    (country, city), (_, wrong) = rng.sample(CAPITALS, 2)
    q = rng.choice(["What is the capital of {c}?", "Name the capital city of {c}."]).format(c=country)
    return q, f"The capital of {country} is {city}.", f"The capital of {country} is {wrong}."


def pair_sum(rng):
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    off = rng.choice([-2, -1, 1, 2])
    q = rng.choice(["What is {a} + {b}?", "{a} + {b} = ?"]).format(a=a, b=b)
    return q, f"{a} + {b} = {a + b}.", f"{a} + {b} = {a + b + off}."


def main():
    rng = random.Random(SEED)
    kinds = [pair_repeat, pair_reverse, pair_capital, pair_sum]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        for i in range(NUM_PAIRS):
            q, chosen, rejected = kinds[i % len(kinds)](rng)
            prompt = [{"role": "user", "content": q}]
            f.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n")
    print(f"wrote {NUM_PAIRS} pairs to {os.path.relpath(OUT, ROOT)}")


if __name__ == "__main__":
    main()
