"""The GSM8K-style word problems (leantrain.data.lm.word_problems): deterministic for a seed, every template drawn,
and every answer right, checked from the text alone: each step's equation is recomputed, its operands are numbers of
the problem, earlier results or the two constants, the last result is the answer, and math:answer and math:solution
agree on it."""

from __future__ import annotations

import json
import re
from fractions import Fraction

import pytest

from leantrain.config import resolve
from leantrain.data.lm import word_problems as wp
from leantrain.data.modalities import for_modality
from leantrain.methods.grpo import answers
from leantrain.methods.grpo.rewards import check_rewards, load_rewards

EQUATION = re.compile(r"((?:\d+\s*[-+*/]\s*)+\d+)\s*=\s*(\d+)")
CONSTANTS = {60, 100}


def _evaluate(expression: str) -> Fraction:
    """``a op b op c`` with * and / before + and -, exactly (the steps' own arithmetic, not the generator's)."""
    tokens = re.findall(r"\d+|[-+*/]", expression)
    terms, ops = [Fraction(tokens[0])], []
    for op, n in zip(tokens[1::2], tokens[2::2]):
        if op in "*/":
            terms[-1] = terms[-1] * int(n) if op == "*" else terms[-1] / int(n)
        else:
            terms.append(Fraction(n))
            ops.append(op)
    total = terms[0]
    for op, t in zip(ops, terms[1:]):
        total = total + t if op == "+" else total - t
    return total


def test_the_same_seed_gives_the_same_rows_and_another_seed_others():
    assert wp.build(n_train=50, n_eval=5) == wp.build(n_train=50, n_eval=5)
    assert wp.build(seed=1, n_train=50, n_eval=5) != wp.build(n_train=50, n_eval=5)


def test_every_answer_is_right_from_the_text_alone():
    train, evaluation = wp.build(n_train=400, n_eval=50)
    seen = set()
    for r in train + evaluation:
        question = r["prompt"][0]["content"]
        assert r["prompt"][0]["role"] == "user" and question.endswith(wp.INSTRUCTION)
        known = {int(n) for n in re.findall(r"\d+", question)} | CONSTANTS
        *steps, last = r["solution"].split("\n")
        assert 2 <= len(steps) <= 4 and last == f"#### {r['answer']}", r
        result = None
        for step in steps:
            (expression, result), = EQUATION.findall(step)
            operands = {int(n) for n in re.findall(r"\d+", expression)}
            assert operands <= known, (step, question)
            assert _evaluate(expression) == int(result), step
            known.add(int(result))
        assert isinstance(r["answer"], int) and r["answer"] == int(result) >= 0, r
        assert answers.expected(r["solution"]) == answers.expected(r["answer"]) == r["answer"]
        seen.add(re.sub("|".join([*wp.NAMES, r"\d+"]), "", question)[:7])  # the template: names, numbers out
    assert len(seen) == len(wp.TEMPLATES), seen


@pytest.mark.usefixtures("own_datasets_cache")
def test_the_writer_writes_prompts_the_grpo_side_and_the_math_rewards_read(tmp_path):
    train, evaluation = wp.write(tmp_path / "out")
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    assert rows == wp.build()[0]
    data = resolve(None, [f"data.train={train}", f"data.eval={evaluation}"]).data
    prepared = for_modality("prompts").load_and_validate(data, seed=0, batch_size=4)
    assert (len(prepared.train), len(prepared.eval)) == (wp.N_TRAIN, wp.N_EVAL)
    check_rewards(load_rewards(["math:answer", "math:solution", "format:boxed"]), rows[:2], conversational=True)
