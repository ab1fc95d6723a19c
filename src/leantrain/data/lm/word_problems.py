r"""GSM8K-style math word problems for GRPO (examples/grpo-gsm8k.yaml): multi-step problems (2-4 operations: shopping
and change, rates, ages, sharing, savings, discounts, travel, harvests), generated from a seed, because the real
GSM8K is a download and these machines have no network. Rows:

- ``prompt``: one user turn, the problem then the instruction TRL / DeepSeek-R1 / Qwen-Math GRPO recipes use on
  GSM8K and MATH, "Please reason step by step, and put your final answer within \boxed{}.";
- ``answer``: the answer (an int), for ``grpo.rewards=[math:answer]``;
- ``solution``: a worked solution in GSM8K's own shape, one step a line, each step one equation (``a * b = c``, the
  operators ``+ - * /``), ending ``#### <answer>``: ``math:solution`` reads 72 from it as from ``answer``, and TRL's
  ``accuracy_reward`` (which reads a ``solution`` column) runs on it unchanged.

Every number a step uses is written in the problem, an earlier step's result, or 60 (minutes in an hour) or 100 (a
percent); every answer is a whole number (divisions come out even by construction). Easier than most of GSM8K:
2-4 steps, small numbers, no distractors, 8 templates. How a model does on them is not measured yet. Generated from
a seed, no files shipped:

    python -m leantrain.data.lm.word_problems OUT_DIR     # writes OUT_DIR/train.jsonl and OUT_DIR/eval.jsonl
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Callable

from leantrain.files import write_atomic

SEED = 4321
N_TRAIN = 2000
N_EVAL = 100
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
NAMES = ["Maya", "Liam", "Sofia", "Noah", "Aisha", "Mateo", "Chen", "Priya", "Omar", "Elena", "Kofi", "Hana"]
ITEMS = ["notebooks", "pens", "apples", "muffins", "candles", "stickers", "mugs", "plants", "books", "scarves"]
Problem = tuple[str, list[str], int]  # the problem, its steps (one equation each), the answer


def _s(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def shopping(rng: random.Random) -> Problem:
    name, (one, two) = rng.choice(NAMES), rng.sample(ITEMS, 2)
    a, p, b, q = rng.randint(2, 9), rng.randint(2, 15), rng.randint(2, 9), rng.randint(2, 15)
    c1, c2 = a * p, b * q
    bill = next(x for x in (20, 50, 100, 200, 500) if x > c1 + c2)
    return (f"{name} buys {a} {one} at ${p} each and {b} {two} at ${q} each, and pays with a ${bill} bill. How much "
            f"change, in dollars, does {name} get back?",
            [f"The {one} cost {a} * {p} = {c1} dollars.", f"The {two} cost {b} * {q} = {c2} dollars.",
             f"Together they cost {c1} + {c2} = {c1 + c2} dollars.",
             f"The change is {bill} - {c1 + c2} = {bill - c1 - c2} dollars."], bill - c1 - c2)


def rates(rng: random.Random) -> Problem:
    r, h, m = rng.randint(3, 12), rng.randint(1, 4), rng.choice([10, 15, 20, 30, 45])
    minutes = h * 60 + m
    return (f"A machine packs {r} boxes every minute. How many boxes does it pack in {_s(h, 'hour')} and {m} "
            "minutes?",
            [f"{_s(h, 'hour')} is {h} * 60 = {h * 60} minutes.", f"In all it runs {h * 60} + {m} = {minutes} minutes.",
             f"It packs {minutes} * {r} = {minutes * r} boxes."], minutes * r)


def ages(rng: random.Random) -> Problem:
    a, b, c = rng.sample(NAMES, 3)
    young, d, k, y = rng.randint(3, 12), rng.randint(2, 9), rng.randint(2, 4), rng.randint(2, 10)
    return (f"{c} is {young} years old. {b} is {d} years older than {c}, and {a} is {k} times as old as {b}. How old "
            f"will {a} be in {y} years?",
            [f"{b} is {young} + {d} = {young + d} years old.",
             f"{a} is {k} * {young + d} = {k * (young + d)} years old.",
             f"In {y} years {a} will be {k * (young + d)} + {y} = {k * (young + d) + y}."], k * (young + d) + y)


def sharing(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    each, friends, jars, per_jar = rng.randint(2, 6), rng.randint(2, 6), rng.randint(2, 5), rng.randint(2, 9)
    given, baked = each * friends, each * friends + jars * per_jar
    return (f"{name} baked {baked} cookies, gave {each} cookies to each of {friends} friends and shared the rest "
            f"equally among {jars} jars. How many cookies went in each jar?",
            [f"{name} gave away {each} * {friends} = {given} cookies.",
             f"That left {baked} - {given} = {baked - given} cookies.",
             f"Each jar got {baked - given} / {jars} = {per_jar} cookies."], per_jar)


def savings(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    earns = rng.randint(12, 40)
    spends, weeks, has = rng.randint(2, earns - 5), rng.randint(3, 12), 5 * rng.randint(1, 6)
    saved = earns - spends
    goal = has + weeks * saved
    return (f"{name} earns ${earns} a week and spends ${spends} of it. {name} already has ${has} saved. How many "
            f"weeks will it take {name} to have ${goal} for a new bike?",
            [f"{name} saves {earns} - {spends} = {saved} dollars a week.",
             f"{name} still needs {goal} - {has} = {goal - has} dollars.",
             f"That takes {goal - has} / {saved} = {weeks} weeks."], weeks)


def discount(rng: random.Random) -> Problem:
    name = rng.choice(NAMES)
    price, pct, n = 20 * rng.randint(1, 10), rng.choice([10, 20, 25, 50]), rng.randint(2, 5)
    off = price * pct // 100
    return (f"A jacket costs ${price}. In a sale every jacket is {pct}% off. {name} buys {n} jackets. How many "
            f"dollars does {name} pay?",
            [f"The discount is {price} * {pct} / 100 = {off} dollars.",
             f"One jacket costs {price} - {off} = {price - off} dollars.",
             f"{n} jackets cost {price - off} * {n} = {(price - off) * n} dollars."], (price - off) * n)


def travel(rng: random.Random) -> Problem:
    s1, h1, s2, h2 = 10 * rng.randint(4, 12), rng.randint(1, 4), 10 * rng.randint(4, 12), rng.randint(1, 3)
    return (f"A train travels at {s1} km per hour for {_s(h1, 'hour')}, then at {s2} km per hour for "
            f"{_s(h2, 'hour')}. How many kilometers does it travel in all?",
            [f"First it goes {s1} * {h1} = {s1 * h1} km.", f"Then it goes {s2} * {h2} = {s2 * h2} km.",
             f"In all it travels {s1 * h1} + {s2 * h2} = {s1 * h1 + s2 * h2} km."], s1 * h1 + s2 * h2)


def harvest(rng: random.Random) -> Problem:
    rows, per_row, box = rng.randint(3, 9), rng.randint(4, 12), rng.choice([2, 3, 4, 5, 6])
    each = box * rng.randint(1, 4)
    plants = rows * per_row
    return (f"A farmer plants {rows} rows of {per_row} tomato plants. Each plant gives {each} tomatoes, and the "
            f"farmer packs them in boxes of {box}. How many boxes does the farmer fill?",
            [f"There are {rows} * {per_row} = {plants} plants.",
             f"They give {plants} * {each} = {plants * each} tomatoes.",
             f"That fills {plants * each} / {box} = {plants * each // box} boxes."], plants * each // box)


TEMPLATES: list[Callable[[random.Random], Problem]] = [shopping, rates, ages, sharing, savings, discount, travel,
                                                        harvest]


def row(problem: Problem) -> dict:
    """A problem as a row: the prompt (one user turn), its answer and its GSM8K-style solution."""
    text, steps, answer = problem
    return {"prompt": [{"role": "user", "content": f"{text}\n{INSTRUCTION}"}], "answer": answer,
            "solution": "\n".join(steps) + f"\n#### {answer}"}


def build(seed: int = SEED, n_train: int = N_TRAIN, n_eval: int = N_EVAL) -> tuple[list[dict], list[dict]]:
    """(train, eval) rows, the templates drawn in turn at random; deterministic for a seed."""
    rng = random.Random(seed)
    rows = [row(rng.choice(TEMPLATES)(rng)) for _ in range(n_train + n_eval)]
    return rows[:n_train], rows[n_train:]


def write(out_dir: str | os.PathLike, seed: int = SEED) -> tuple[Path, Path]:
    """Write train.jsonl and eval.jsonl into ``out_dir``, overwriting; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.jsonl", out / "eval.jsonl"
    for path, rows in zip(paths, build(seed)):
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m leantrain.data.lm.word_problems OUT_DIR")
    for p in write(sys.argv[1]):
        print(p)
