"""The reward of benchmarks/against/grpo_vs_trl.py, one file both tools load: TRL's GRPOTrainer as a function
(``reward_funcs=[correct]``), leantrain as ``grpo.rewards=[benchmarks/against/grpo_reward.py:correct]``. TRL's
signature; the rule of leantrain's built-in ``numeric:answer``, written out so that neither tool's own code scores."""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def correct(prompts, completions, completion_ids, answer, **kwargs) -> list[float]:
    """1.0 when the last number in the completion equals the row's ``answer``, else 0.0. A conversational
    completion (``[{"role": "assistant", "content": text}]``) is read as its text."""
    out = []
    for completion, expected in zip(completions, answer):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        numbers = NUMBER.findall(text)
        out.append(1.0 if numbers and float(numbers[-1]) == float(expected) else 0.0)
    return out
