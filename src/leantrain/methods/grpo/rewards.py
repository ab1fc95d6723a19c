"""GRPO's reward functions (``grpo.rewards``): loaded from a file (``FILE.py:FUNCTION``), a module
(``module:function``) or built in, called with TRL's signature and checked as TRL's ``_calculate_rewards`` reads them.

A function is called ``f(prompts=..., completions=..., completion_ids=..., **columns)``: one entry per completion in
each list (a prompt, and each of its row's other columns, repeated for each of its completions), the completions as
text, or for conversational prompts as ``[{"role": "assistant", "content": text}]``; the completion token ids
without padding. A function without ``**kwargs`` is given only the arguments it names (TRL passes every column, so a
function written for TRL runs unchanged; TRL's ``trainer_state`` is not passed). It returns one float per completion,
or None where it has no opinion (a reward for other rows' kind); a completion's reward is the weighted sum of its
functions' scores with the None left out (TRL's nansum: all None is 0).

Built-ins (no code): ``match:COLUMN`` 1 when the completion, stripped, equals the row's COLUMN (stripped), else 0;
``numeric:COLUMN`` 1 when the last number in the completion equals the row's COLUMN as a number, else 0;
``regex:PATTERN`` 1 when the completion matches PATTERN (``re.search``), else 0; ``length:N`` 1 at N completion
tokens, falling linearly to 0 at 0 and 2N tokens. For math (``answers.py`` says how an answer is read and why):
``math:COLUMN`` 1 when the completion's final answer (the last ``\\boxed{}``, else after the last ``####``, else the
last number) equals the row's COLUMN as a number (exact fractions: ``3/4`` = ``0.75``, ``1,234`` = 1234), the
COLUMN read the same way, so a GSM8K solution ending ``#### 72`` is 72; ``format:boxed`` 1 when the final answer is a
``\\boxed{}`` holding a number; ``format:gsm8k`` 1 when the last line is ``#### NUMBER``; ``format:think`` TRL's
``think_format_reward`` (``<think>...</think>`` first, then the answer). TRL's own ``accuracy_reward`` (math_verify)
runs as ``trl.rewards:accuracy_reward`` where trl and math-verify are installed, on a ``solution`` column and
conversational prompts (it reads ``completion[0]["content"]``).

Errors: a spec that cannot be loaded (no file, no function, a signature that cannot take the arguments) is a
ConfigError naming ``grpo.rewards[i]``; a column a function needs that the data lacks, a wrong return (length, a
non-number, NaN or an infinite value: None is how a function says it has no score, so a NaN is never taken for one)
or an exception inside is a UserError naming the function, the step (``score``), evaluation or the dry call on the
first rows before training (``check_rewards``), and the row: the completion, its prompt and the value returned. For
an exception the function is called again on one completion at a time to find the first that raises alone (named
with the original exception's text, which is chained).
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from leantrain.errors import ConfigError, UserError
from leantrain.methods.grpo import answers
from leantrain.environments.user_code import load_module

STANDARD = ("prompts", "completions", "completion_ids")  # what every call passes beside the columns
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
PLACEHOLDER = "0"  # the completion of check_rewards' dry call


@dataclass(frozen=True)
class Reward:
    name: str  # the function's name (TRL's reward_func_names), or the built-in as written: metrics rewards/<name>/...
    fn: Callable
    weight: float = 1.0


def load_rewards(specs: list[str], weights: list[float] | None = None) -> list[Reward]:
    """``grpo.rewards`` (and ``grpo.reward_weights``, unset = 1 each) -> Rewards; a ConfigError naming
    ``grpo.rewards[i]`` for one that cannot be loaded or called with TRL's arguments."""
    weights = [1.0] * len(specs) if weights is None else weights
    out = []
    for i, (spec, weight) in enumerate(zip(specs, weights)):
        key = f"grpo.rewards[{i}]={spec}"
        name, fn = _builtin(spec, key) if spec.split(":", 1)[0] in BUILTINS else _imported(spec, key)
        _check_signature(fn, key)
        out.append(Reward(name, fn, float(weight)))
    return out


def check_rewards(rewards: list[Reward], rows: list[dict], conversational: bool) -> None:
    """A dry call of every function on the first ``rows`` (their ``prompt`` and other columns) with a placeholder
    completion, before the model loads: the columns each needs are there, and it returns what ``score`` takes."""
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
    for r in rewards:
        missing = [c for c in needed_columns(r.fn) if c not in columns]
        if missing:
            raise UserError(f"reward {r.name}: needs the column {missing[0]!r}, which the data lacks; its columns "
                            f"beside prompt: {', '.join(columns) or 'none'}")
    prompts = [r["prompt"] for r in rows]
    score(rewards, prompts, [PLACEHOLDER] * len(rows), [[] for _ in rows], columns, conversational=conversational,
          step=None)


def score(rewards: list[Reward], prompts: list, completions: list[str], completion_ids: list[list[int]],
          columns: dict[str, list], *, conversational: bool, step: int | str | None) -> np.ndarray:
    """Each function's scores of the completions: ``(N, F)`` float64, NaN where a function returned None. Every list
    holds one entry per completion. ``step``: the optimizer step, for the error (None: the dry call; a text: where,
    e.g. ``in evaluation``)."""
    given = [[{"role": "assistant", "content": c}] for c in completions] if conversational else list(completions)
    args = {"prompts": list(prompts), "completions": given, "completion_ids": completion_ids, **columns}
    out = np.full((len(completions), len(rewards)), np.nan)
    when = ("in the dry call on the first rows before training" if step is None else step if isinstance(step, str)
            else f"at step {step}")
    row = functools.partial(_row, list(prompts), len(completions))
    for j, r in enumerate(rewards):
        try:
            returned = r.fn(**_arguments(r.fn, args))
        except Exception as e:
            where = _failing_row(r.fn, args, len(completions))
            raise UserError(f"reward {r.name} failed {when}{'' if where is None else ' on ' + row(where)}: "
                            f"{type(e).__name__}: {e}") from e
        out[:, j] = _values(returned, len(completions), f"reward {r.name} {when}", row)
    return out


def _row(prompts: list, n: int, i: int) -> str:
    """``completion 5 of 8 (prompt 'What is 2 + 3?')``: a completion and its prompt, for an error."""
    prompt = prompts[i] if i < len(prompts) else None
    if isinstance(prompt, list):  # messages: the last turn's text
        prompt = prompt[-1].get("content") if prompt and isinstance(prompt[-1], dict) else prompt
    text = repr(prompt) if not isinstance(prompt, str) or len(prompt) <= 80 else repr(prompt[:77] + "...")
    return f"completion {i} of {n} (prompt {text})"


def _failing_row(fn: Callable, args: dict, n: int) -> int | None:
    """The first completion on which ``fn`` raises when called on it alone (every list cut to its entry), or None
    when none does (it failed on the batch as a whole). Only after it raised on the batch."""
    for i in range(n):
        try:
            fn(**_arguments(fn, {k: v[i:i + 1] for k, v in args.items()}))
        except Exception:
            return i
    return None


def combine(scores: np.ndarray, rewards: list[Reward]) -> np.ndarray:
    """Each completion's reward ``(N,)``: the weighted sum of its scores, NaN (None) left out (TRL's nansum)."""
    weights = np.asarray([r.weight for r in rewards], dtype=np.float64)
    return np.nansum(scores * weights, axis=1)


def needed_columns(fn: Callable) -> tuple[str, ...]:
    """The data columns a function cannot run without: a built-in's column, or a parameter without a default that
    is not one of TRL's standard arguments."""
    declared = getattr(fn, "columns", ())
    params = inspect.signature(fn).parameters.values()
    named = [p.name for p in params if p.default is inspect.Parameter.empty and p.name not in STANDARD
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return (*declared, *named)


# ------------------------------------------------------------------------------------------ loading


def _imported(spec: str, key: str) -> tuple[str, Callable]:
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"{key}: not FILE.py:FUNCTION, module:function or a built-in ({', '.join(BUILTINS)}: "
                          "e.g. numeric:answer)")
    module = load_module(where, key, "rewards", "FILE.py:FUNCTION")
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise ConfigError(f"{key}: {where} has no {name!r}; its functions: {', '.join(defined) or 'none'}")
    if not callable(fn):
        raise ConfigError(f"{key}: {where}'s {name!r} is a {type(fn).__name__}, not a function")
    return getattr(fn, "__name__", name), fn


def _check_signature(fn: Callable, key: str) -> None:
    """A function TRL's keyword arguments can reach: no positional-only parameter without a default, and
    ``completions`` (or ``**kwargs``) among its parameters: it has to read the completions it scores."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{key}: its signature cannot be read ({e})") from None
    blocked = [p.name for p in params if p.kind == p.POSITIONAL_ONLY and p.default is p.empty]
    if blocked:
        raise ConfigError(f"{key}: parameter {blocked[0]!r} is positional-only; rewards are called with keywords "
                          "f(prompts=, completions=, completion_ids=, **columns)")
    if not any(p.name == "completions" or p.kind == p.VAR_KEYWORD for p in params):
        raise ConfigError(f"{key}: it takes no 'completions' parameter (nor **kwargs), so it cannot score them; "
                          "TRL's signature is f(prompts, completions, completion_ids, **kwargs)")


def _arguments(fn: Callable, args: dict) -> dict:
    """``args`` as a function takes them: all with ``**kwargs``, else those it names."""
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return args
    return {k: v for k, v in args.items() if k in params}


def _values(returned, n: int, who: str,  # noqa: ANN001 - whatever the function returned
            row: Callable[[int], str] = lambda i: f"completion {i}") -> np.ndarray:
    """What a function returned as ``n`` floats (NaN: None); a UserError naming ``who`` and the ``row`` of a bad
    value (a non-number, NaN, an infinity)."""
    if isinstance(returned, (str, bytes, dict)) or not hasattr(returned, "__len__"):
        raise UserError(f"{who} returned a {type(returned).__name__}, not a list of {n} numbers (one per completion)")
    if len(returned) != n:
        raise UserError(f"{who} returned {len(returned)} values for {n} completions; return one per completion "
                        "(None where it has no score)")
    out = np.empty(n)
    for i, v in enumerate(returned):
        if v is None:
            out[i] = np.nan
            continue
        if isinstance(v, numbers.Real) or (hasattr(v, "item") and getattr(v, "ndim", 1) == 0):
            out[i] = float(v)
        else:
            raise UserError(f"{who} returned {v!r} ({type(v).__name__}) for {row(i)}; a reward is a number "
                            "or None")
        if math.isinf(out[i]):
            raise UserError(f"{who} returned {out[i]} for {row(i)}; a reward is finite (None: no score)")
        if math.isnan(out[i]):
            raise UserError(f"{who} returned nan for {row(i)}; a reward is a finite number, or None where the "
                            "function has no score for a completion (left out of its mean, as TRL's None)")
    return out


# ------------------------------------------------------------------------------------------ built-ins


def _text(completion) -> str:  # noqa: ANN001 - a text or a conversational completion
    return completion[-1]["content"] if isinstance(completion, list) else completion


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands commas dropped), or None."""
    found = NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def _as_number(value) -> float | None:  # noqa: ANN001 - a column's value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return last_number(str(value)) if isinstance(value, str) and NUMBER.fullmatch(value.strip().replace(",", "")) \
        else None


def _match(column: str) -> Callable:
    def match(completions, **columns) -> list[float]:  # noqa: ANN001
        return [float(_text(c).strip() == str(v).strip()) for c, v in zip(completions, columns[column])]
    return match


def _numeric(column: str) -> Callable:
    def numeric(completions, **columns) -> list[float]:  # noqa: ANN001
        out = []
        for c, v in zip(completions, columns[column]):
            want = _as_number(v)
            if want is None:
                raise ValueError(f"the column {column!r} holds {v!r}, not a number")
            out.append(float(last_number(_text(c)) == want))
        return out
    return numeric


def _math(column: str) -> Callable:
    def math_answer(completions, **columns) -> list[float]:  # noqa: ANN001
        out = []
        for c, v in zip(completions, columns[column]):
            want = answers.expected(v)
            if want is None:
                raise ValueError(f"the column {column!r} holds {v!r}, with no number to compare with (a number, "
                                 "a \\boxed{} answer or a GSM8K solution ending in #### N)")
            out.append(float(answers.final_answer(_text(c)) == want))
        return out
    return math_answer


FORMATS = {"boxed": answers.boxes_a_number, "gsm8k": answers.ends_with_gsm8k_answer,
           "think": answers.thinks_then_answers}  # format:NAME -> what a completion must satisfy


def _format(name: str) -> Callable:
    check = FORMATS[name]

    def format_(completions, **_) -> list[float]:  # noqa: ANN001
        return [float(check(_text(c))) for c in completions]
    return format_


def _regex(pattern: str) -> Callable:
    compiled = re.compile(pattern)

    def regex(completions, **_) -> list[float]:  # noqa: ANN001
        return [float(compiled.search(_text(c)) is not None) for c in completions]
    return regex


def _length(target: int) -> Callable:
    def length(completion_ids, **_) -> list[float]:  # noqa: ANN001
        return [max(0.0, 1.0 - abs(len(ids) - target) / target) for ids in completion_ids]
    return length


def _builtin(spec: str, key: str) -> tuple[str, Callable]:
    kind, _, arg = spec.partition(":")
    if not arg:
        example = {"length": "20", "regex": "^[0-9]+$", "format": "boxed"}.get(kind, "answer")
        raise ConfigError(f"{key}: {kind}: needs its {BUILTINS[kind]} after the colon, e.g. {kind}:{example}")
    if kind == "format":
        if arg not in FORMATS:
            raise ConfigError(f"{key}: no format {arg!r}; the formats: {', '.join(FORMATS)}")
        fn = _format(arg)
    elif kind == "regex":
        try:
            fn = _regex(arg)
        except re.error as e:
            raise ConfigError(f"{key}: not a regular expression ({e})") from None
    elif kind == "length":
        if not arg.isdigit() or int(arg) < 1:
            raise ConfigError(f"{key}: length:N takes a whole number of tokens N >= 1")
        fn = _length(int(arg))
    else:
        fn = {"match": _match, "numeric": _numeric, "math": _math}[kind](arg)
        fn.columns = (arg,)
    return spec, fn


BUILTINS = {"match": "COLUMN", "numeric": "COLUMN", "math": "COLUMN", "format": "NAME", "regex": "PATTERN",
            "length": "N"}
