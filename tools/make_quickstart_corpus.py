#!/usr/bin/env python3
"""Writes recipes/quickstart/corpus.txt: the small English corpus the quickstart trains on.

Nothing is downloaded: short documents are generated from templates with a fixed seed, so the
text has structure a small byte-level model can learn in minutes on a CPU (spelling, grammar,
recurring facts, simple arithmetic). Documents are separated by blank lines.
Run from the repository root: python3 tools/make_quickstart_corpus.py
"""
import random

rng = random.Random(20261122)

names = ["Ada", "Boris", "Chen", "Dalia", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun",
         "Kofi", "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq"]
places = {"the harbour": "boats", "the library": "books", "the market": "apples",
          "the workshop": "tools", "the garden": "roses", "the station": "trains",
          "the bakery": "bread", "the museum": "paintings", "the school": "maps",
          "the observatory": "stars"}
weather = ["cold", "warm", "windy", "quiet", "bright", "grey", "rainy", "calm"]
times = ["In the morning", "At noon", "In the evening", "Late at night", "On Sunday", "After lunch"]
verbs = [("counted", "counts"), ("painted", "paints"), ("repaired", "repairs"),
         ("carried", "carries"), ("sorted", "sorts"), ("studied", "studies")]
numbers = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
           "eighteen", "nineteen", "twenty"]
# fixed facts, repeated across documents so that they can be memorised
home = {n: rng.choice(list(places)) for n in names}
friend = {n: rng.choice([m for m in names if m != n]) for n in names}


def story():
    n = rng.choice(names)
    place = home[n]
    thing = places[place]
    past, present = rng.choice(verbs)
    k = rng.randint(2, 9)
    lines = [
        f"{rng.choice(times)} the weather was {rng.choice(weather)}.",
        f"{n} went to {place}, as {n} does every day.",
        f"There {n} {past} {numbers[k]} {thing}.",
        f"{friend[n]} came later and {past} {numbers[k + 1]} more.",
        f"Together they {past} {numbers[2 * k + 1]} {thing}.",
        f"{n} said: \"Tomorrow I will come back to {place}.\"",
    ]
    return " ".join(lines[: rng.randint(3, len(lines))])


def arithmetic():
    out = []
    for _ in range(rng.randint(3, 6)):
        a, b = rng.randint(0, 10), rng.randint(0, 10)
        if rng.random() < 0.5:
            out.append(f"{numbers[a]} plus {numbers[b]} is {numbers[a + b]}.")
        else:
            a, b = max(a, b), min(a, b)
            out.append(f"{numbers[a]} minus {numbers[b]} is {numbers[a - b]}.")
    return " ".join(out)


def facts():
    n = rng.choice(names)
    return (f"{n} works at {home[n]}. The best friend of {n} is {friend[n]}. "
            f"At {home[n]} you will find {places[home[n]]}.")


def dialogue():
    a, b = rng.sample(names, 2)
    place = home[b]
    return (f"{a}: Where are you going, {b}?\n{b}: To {place}. I need {places[place]}.\n"
            f"{a}: Then I will see you at {place}.")


makers = [story, story, arithmetic, facts, dialogue]
docs = [rng.choice(makers)() for _ in range(2600)]
with open("recipes/quickstart/corpus.txt", "w") as f:
    f.write("\n\n".join(docs) + "\n")
print(f"wrote {len(docs)} documents, {sum(len(d) for d in docs)} characters")
