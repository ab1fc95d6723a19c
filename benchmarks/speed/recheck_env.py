"""The calculator environment of examples/calculator_env.py, except that it never ends an episode itself: an answer
without a tool call is scored (a quarter of a point when right) and met with "Check it once more", so every episode
runs ``grpo.max_turns`` turns unless its token budget ends it first. ``benchmarks/speed/episode_turns.py`` times the
turns with it; not a task anyone trains for."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "leantrain_bench_calculator_env", Path(__file__).resolve().parents[2] / "examples" / "calculator_env.py")
_calculator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_calculator)
AGAIN = {"role": "user", "content": "Check it once more and answer with just the number."}


class Recheck(_calculator.Calculator):
    def step(self, messages: list[dict], completion: str) -> tuple[list[dict], float | None, bool]:
        new, reward, done = super().step(messages, completion)
        if done:  # an answer: scored, then asked again
            return [AGAIN], reward / 4, False
        return new, None, False
