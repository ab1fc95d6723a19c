r"""The math built-ins (issue 49 part 5): ``math:COLUMN`` reads a completion's final answer as GSM8K and ``\boxed{}``
prompts write it and compares it with the row's as exact numbers; ``format:boxed|gsm8k|think`` check the format;
TRL's ``accuracy_reward`` runs unchanged through the loader where trl and math-verify are installed, and agrees with
``math:`` on boxed answers."""

from __future__ import annotations

import importlib.util

import pytest

from leantrain.errors import ConfigError, UserError
from leantrain.methods.grpo import answers
from leantrain.methods.grpo.rewards import check_rewards, load_rewards, score

SOLUTION = "She buys 3 bags of 4 apples: 3 * 4 = 12.\nShe had 60, so 60 + 12 = 72.\n#### 72"


def run(specs, completions, columns, conversational=False):
    n = len(completions)
    return score(load_rewards(specs), ["q"] * n, completions, [[1]] * n, columns, conversational=conversational,
                 step=1)


@pytest.mark.parametrize("completion,right", [
    (r"3 * 4 = 12, 12 + 60 = 72. The answer is \boxed{72}.", True),
    (r"\boxed{72}", True),
    (r"First \boxed{5}, no wait: \boxed{72}", True),             # the last box
    (r"\boxed{72} and then 13 more numbers 13", True),            # a box beats a later bare number
    (r"\boxed{\text{72 apples}}", True),                          # nested braces
    (r"\boxed{x = 72}", True),                                    # the number after the last '='
    (r"\boxed{\$72.00}", True),
    (r"\boxed{13} ... \boxed{72", False),                         # cut off inside the last box: the closed one counts
    (r"\boxed{seventy-two}", False),                              # a box with no number: wrong, not "look further"
    ("3 * 4 = 12\n#### 72", True),
    ("#### 72\nThen more text with 5", True),                     # the first number after the last ####
    ("#### 13\n...#### 72.", True),
    ("#### \n", False),
    ("12 + 60 = 72", True),                                       # no box, no ####: the last number
    ("The answer is 72.", True),
    ("72 is what I get, then 60 + 12", False),
    ("no idea", False),
    ("", False),
])
def test_math_reads_the_final_answer(completion, right):
    assert run(["math:answer"], [completion], {"answer": [72]})[0, 0] == float(right)


@pytest.mark.parametrize("completion,answer", [
    (r"\boxed{1,234}", 1234), ("#### $1,234", "1,234"), ("so 1234", "1,234"), (r"\boxed{3/4}", 0.75),
    (r"\boxed{\frac{3}{4}}", "3/4"), (r"\boxed{\dfrac{6}{8}}", "0.75"), ("#### 0.30", 0.3), ("-5", -5),
    (r"\boxed{-5}", "#### -5"), ("#### 50%", 50), ("it is 72.", SOLUTION), (r"\boxed{72}", r"\boxed{72}"),
])
def test_numbers_compare_as_numbers_and_the_column_is_read_the_same_way(completion, answer):
    assert run(["math:answer"], [completion], {"answer": [answer]})[0, 0] == 1.0


def test_commas_that_are_not_thousands_separate_numbers():
    assert answers.numbers_in("1,2,3 and 1,234 and 10-3") == [1, 2, 3, 1234, 10, 3]
    assert answers.final_answer(r"0.1 + 0.2 = \boxed{0.3}") == answers.expected(0.3)


def test_math_reads_conversational_completions_and_a_column_without_a_number_stops_naming_it():
    assert run(["math:answer"], [r"\boxed{7}", "8"], {"answer": ["7", 7]}, conversational=True)[:, 0].tolist() \
        == [1.0, 0.0]
    with pytest.raises(UserError, match=r"reward math:answer failed .* the column 'answer' holds 'seven', with no "
                       "number"):
        run(["math:answer"], ["7"], {"answer": ["seven"]})
    with pytest.raises(UserError, match="reward math:solution: needs the column 'solution'"):
        check_rewards(load_rewards(["math:solution"]), [{"prompt": "q", "answer": 1}], conversational=False)


@pytest.mark.parametrize("spec,completion,ok", [
    ("format:boxed", r"steps... \boxed{72}", True),
    ("format:boxed", r"\boxed{}", False),
    ("format:boxed", r"\boxed{72", False),
    ("format:boxed", "#### 72", False),
    ("format:gsm8k", "3 * 4 = 12\n#### 1,234.\n", True),
    ("format:gsm8k", "#### $72", True),
    ("format:gsm8k", "#### 72 apples", False),
    ("format:gsm8k", "#### 72\nand more", False),
    ("format:gsm8k", r"\boxed{72}", False),
    ("format:think", "<think>\n3 * 4 = 12\n</think>\n\\boxed{12}", True),
    ("format:think", "<think>a</think>", True),
    ("format:think", "<think>a</think><think>b</think>", False),
    ("format:think", "answer <think>a</think>", False),
    ("format:think", "<think>never closed", False),
])
def test_format_rewards(spec, completion, ok):
    assert run([spec], [completion], {})[0, 0] == float(ok)


def test_a_format_that_does_not_exist_exits_2_naming_the_formats():
    with pytest.raises(ConfigError, match=r"grpo.rewards\[0\]=format:latex: no format 'latex'; the formats: boxed, "
                       "gsm8k, think"):
        load_rewards(["format:latex"])
    with pytest.raises(ConfigError, match="format: needs its NAME after the colon, e.g. format:boxed"):
        load_rewards(["format:"])


TRL = all(importlib.util.find_spec(m) is not None for m in ("trl", "math_verify"))


@pytest.mark.skipif(not TRL, reason="trl and math-verify are not installed (pip install 'trl>=1.0' math-verify: "
                    "the bench extra)")
def test_trls_accuracy_reward_runs_unchanged_and_agrees_with_math_on_boxed_answers():
    r"""TRL's own function through leantrain's loader, on conversational completions and a ``solution`` column (what
    it reads), beside ``math:solution`` on the same rows. They agree on a ``\boxed{}`` answer; TRL's reads nothing
    else (``try_extract_without_anchor=False``), where ``math:`` reads ``####`` and the last number."""
    solutions = ["72", "1,234", r"\frac{3}{4}", "0.75", SOLUTION, "5"]
    boxed = [r"so \boxed{72}", r"\boxed{1234}", r"\boxed{0.75}", r"\boxed{\frac{3}{4}}", r"\boxed{72}", r"\boxed{6}"]
    scores = run(["trl.rewards:accuracy_reward", "math:solution"], boxed, {"solution": solutions},
                 conversational=True)
    assert scores[:, 0].tolist() == scores[:, 1].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    bare = run(["trl.rewards:accuracy_reward", "math:solution"], ["#### 72", "so it is 72"],
               {"solution": ["72", "72"]}, conversational=True)
    assert bare.tolist() == [[0.0, 1.0], [0.0, 1.0]]
