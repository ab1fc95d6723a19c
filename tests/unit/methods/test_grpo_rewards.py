"""GRPO's reward functions (issue 33 part 2): a function written for TRL runs unchanged from a file or a module, the
built-ins score as documented, every way a reward can be wrong stops naming it, and the scores combine as TRL's
weighted nansum."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from leantrain.errors import ConfigError, UserError
from leantrain.methods.grpo.rewards import check_rewards, combine, load_rewards, score

TRL_REWARD = '''
import re

def format_reward(completions, **kwargs):
    """TRL's documented example: 1 for <think>...</think><answer>...</answer>."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    contents = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if re.match(pattern, c) else 0.0 for c in contents]

def exact(prompts, completions, completion_ids, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]

def needs_column(completions, solution):
    return [float(c == s) for c, s in zip(completions, solution)]

def only_some(completions, kind, **kwargs):
    return [None if k == "other" else 1.0 for k in kind]

def short(completions):
    return [1.0]

def text(completions, **kwargs):
    return "1.0"

def words(completions, **kwargs):
    return ["yes" for _ in completions]

def infinite(completions, **kwargs):
    return [float("inf") for _ in completions]

def broken(completions, **kwargs):
    return [1 / 0 for _ in completions]

def not_a_number(completions, **kwargs):
    return [0.5, float("nan")]

def raises_on_one(prompts, completions, answer, **kwargs):
    return [{"4": 1.0, "7": 0.0}[a] for a in answer]  # KeyError on an answer it has no rule for

def raises_on_the_batch(completions, **kwargs):
    if len(completions) > 1:
        raise RuntimeError("the scoring service is down")
    return [1.0]

def positional(completions, /):
    return [0.0]

def blind(prompts):
    return [0.0 for _ in prompts]

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(TRL_REWARD))
    return path


def run(specs, completions, columns, conversational=False, weights=None, step=3):
    rewards = load_rewards(specs, weights)
    n = len(completions)
    return score(rewards, ["q"] * n, completions, [[1] * len(c) for c in completions], columns,
                 conversational=conversational, step=step), rewards


def test_a_trl_reward_file_runs_unchanged(reward_file):
    done = "<think>a</think><answer>4</answer>"
    scores, rewards = run([f"{reward_file}:format_reward", f"{reward_file}:exact"], [done, "4", " 5 "],
                          {"answer": ["4", "4", "4"], "unread": [0, 0, 0]})
    assert [r.name for r in rewards] == ["format_reward", "exact"]
    assert scores.tolist() == [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    conversational, _ = run([f"{reward_file}:format_reward"], [done, "no"], {}, conversational=True)
    assert conversational.tolist() == [[1.0], [0.0]]  # the completion as [{"role": "assistant", "content": ...}]


def test_a_module_function_with_trls_signature_runs(tmp_path, monkeypatch):
    (tmp_path / "team_rewards.py").write_text(
        "def has_digit(completions, **kw):\n    return [float(any(ch.isdigit() for ch in c)) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    scores, _ = run(["team_rewards:has_digit"], ["x1", "x"], {})
    assert scores[:, 0].tolist() == [1.0, 0.0]


def test_the_built_ins_score_as_documented():
    completions = ["The answer is 12.", " 7 ", "1,200", "no number", "ok " * 4]
    columns = {"answer": [12, "7", "1200", 3, 5], "label": ["x", "7", "1,200", "no number", "ok ok ok ok"]}
    scores, _ = run(["numeric:answer", "match:label", "regex:^\\d", "length:4"], completions, columns)
    assert scores[:, 0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert scores[:, 1].tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert scores[:, 2].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    lengths = [len(c) for c in completions]  # run() gives each completion len(text) token ids
    assert scores[:, 3].tolist() == pytest.approx([max(0.0, 1 - abs(n - 4) / 4) for n in lengths])
    scores, _ = run(["numeric:answer", "match:answer"], ["so 7", "7"], {"answer": [7, 7]}, conversational=True)
    assert scores.tolist() == [[1.0, 0.0], [1.0, 1.0]]  # the built-ins read the assistant turn's text


def test_none_is_nan_and_combine_is_trls_weighted_nansum(reward_file):
    scores, rewards = run([f"{reward_file}:only_some", "numeric:answer"], ["1", "2", "3"],
                          {"kind": ["other", "math", "other"], "answer": [1, 1, 0]}, weights=[2.0, 0.5])
    assert np.isnan(scores[0, 0]) and np.isnan(scores[2, 0]) and scores[1, 0] == 1.0
    assert combine(scores, rewards).tolist() == [0.5, 2.0, 0.0]
    all_none = np.full((1, 2), np.nan)
    assert combine(all_none, rewards).tolist() == [0.0]  # TRL: nansum of nothing is 0


@pytest.mark.parametrize("spec,says", [
    ("missing.py:f", r"grpo.rewards\[0\]=missing.py:f: no file"),
    ("{file}:nope", r"has no 'nope'; its functions: blind, broken, exact, format_reward"),
    ("{file}:NOT_A_FUNCTION", "is a int, not a function"),
    ("{file}:positional", "parameter 'completions' is positional-only"),
    ("{file}:blind", "takes no 'completions' parameter"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("os.path:isabs", "os.path:isabs: it takes no 'completions' parameter"),  # imported, but not a reward
    ("justaname", "not FILE.py:FUNCTION, module:function or a built-in"),
    ("regex:(", "not a regular expression"),
    ("length:x", "length:N takes a whole number"),
    ("numeric:", "numeric: needs its COLUMN"),
])
def test_a_reward_that_cannot_be_loaded_exits_2_naming_it(reward_file, spec, says):
    with pytest.raises(ConfigError, match=says) as e:
        load_rewards([spec.format(file=reward_file)])
    assert e.value.exit_code == 2


def test_a_file_that_fails_to_import_is_named(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_module_xyz\n")
    with pytest.raises(ConfigError, match=r"grpo.rewards\[1\]=.*bad.py:f: .*bad.py fails to load: ModuleNotFound"):
        load_rewards(["length:3", f"{bad}:f"])


@pytest.mark.parametrize("name,says", [
    ("short", "at step 3 returned 1 values for 2 completions"),
    ("text", "at step 3 returned a str, not a list of 2 numbers"),
    ("words", "at step 3 returned 'yes' \\(str\\) for completion 0"),
    ("infinite", "at step 3 returned inf for completion 0 of 2 \\(prompt 'q'\\); a reward is finite"),
    ("not_a_number", "at step 3 returned nan for completion 1 of 2 \\(prompt 'q'\\); a reward is a finite number, "
     "or None"),
    ("broken", "failed at step 3 on completion 0 of 2 \\(prompt 'q'\\): ZeroDivisionError: division by zero"),
])
def test_a_bad_return_or_an_exception_stops_naming_the_function_and_step(reward_file, name, says):
    with pytest.raises(UserError, match=f"reward {name} {says}") as e:
        run([f"{reward_file}:{name}"], ["a", "b"], {})
    if name == "broken":
        assert isinstance(e.value.__cause__, ZeroDivisionError)


def test_a_function_that_raises_on_one_row_is_named_with_that_row_and_its_own_message(reward_file):
    """Called on the batch it raises; called again on one completion at a time, the first that raises alone is named
    with its prompt, and the original exception's text and object are kept."""
    rewards = load_rewards([f"{reward_file}:raises_on_one"])
    prompts, answers = ["What is 2 + 2?", "What is 2 + 2?", "What is 9 + 9?", "What is 9 + 9?"], ["4", "4", "18", "18"]
    with pytest.raises(UserError, match=r"reward raises_on_one failed at step 7 on completion 2 of 4 \(prompt 'What "
                       r"is 9 \+ 9\?'\): KeyError: '18'$") as e:
        score(rewards, prompts, ["4"] * 4, [[1]] * 4, {"answer": answers}, conversational=False, step=7)
    assert isinstance(e.value.__cause__, KeyError)
    with pytest.raises(UserError, match=r"reward raises_on_the_batch failed in evaluation: RuntimeError: the scoring "
                       "service is down"):  # no single row raises alone: the batch is named
        score(load_rewards([f"{reward_file}:raises_on_the_batch"]), prompts, ["4"] * 4, [[1]] * 4, {},
              conversational=False, step="in evaluation")
    with pytest.raises(UserError, match=r"for completion 0 of 1 \(prompt 'What is 1 \+ 1\?'\)"):  # messages
        score(load_rewards([f"{reward_file}:infinite"]), [[{"role": "user", "content": "What is 1 + 1?"}]], ["2"],
              [[1]], {}, conversational=True, step=1)


def test_the_dry_call_checks_columns_and_returns_before_training(reward_file):
    rows = [{"prompt": "1+1", "answer": 2}, {"prompt": "2+2", "answer": 4}]
    check_rewards(load_rewards([f"{reward_file}:format_reward", "numeric:answer"]), rows, conversational=False)
    check_rewards(load_rewards(["numeric:answer"]), [{"prompt": [{"role": "user", "content": "1+1"}], "answer": 2}],
                  conversational=True)
    with pytest.raises(UserError, match="reward needs_column: needs the column 'solution', .* beside prompt: answer"):
        check_rewards(load_rewards([f"{reward_file}:needs_column"]), rows, conversational=False)
    with pytest.raises(UserError, match="reward numeric:label: needs the column 'label'"):
        check_rewards(load_rewards(["numeric:label"]), rows, conversational=False)
    with pytest.raises(UserError, match="reward numeric:answer failed in the dry call .* holds 'two', not a number"):
        check_rewards(load_rewards(["numeric:answer"]), [{"prompt": "1+1", "answer": "two"}], conversational=False)
    with pytest.raises(UserError, match="reward short in the dry call on the first rows before training returned 1"):
        check_rewards(load_rewards([f"{reward_file}:short"]), rows, conversational=False)


def test_the_built_in_task_and_its_reward_pass_the_dry_call():
    from leantrain.data.lm import arithmetic

    rows, _ = arithmetic.build(n_train=4, n_eval=0)
    rewards = load_rewards(["numeric:answer"])
    check_rewards(rewards, rows, conversational=True)
    right = [f"The answer is {r['answer']}." for r in rows]
    scores = score(rewards, [r["prompt"] for r in rows], right, [[1]] * 4, {"answer": [r["answer"] for r in rows]},
                   conversational=True, step=0)
    assert scores.tolist() == [[1.0]] * 4
