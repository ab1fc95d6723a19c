"""The prompt texts a causal LM continues, and the checks of a generation's settings before any model loads: what
``continuations``, ``leantrain generate`` and sample prompts share.

- the tokenizer's chat template, when it has one and ``chat`` is not False, wraps each prompt as one user turn with
  the generation prompt (the assistant's turn opened), after a system turn of ``system`` when given and with the
  ``tools`` schemas passed to the template (``leantrain.data.lm.sft.sample_inputs``: both as the run trained with
  them); ``chat=True`` without a template is an error;
- ``check_settings``: max_new_tokens, temperature, top_p and seed in range; ``check_room``: the longest prompt plus
  the new tokens fit the model's positions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from leantrain.errors import UserError


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def uses_chat(tokenizer, chat: bool | None) -> bool:
    """Whether prompts are wrapped in the chat template: ``chat`` as given, else (None) when the tokenizer has one."""
    if chat and not has_chat_template(tokenizer):
        raise UserError("chat=True, but the tokenizer has no chat template (tokenizer_config.json / "
                        "chat_template.jinja); run without it (--no-chat) or use a tokenizer that has one")
    return has_chat_template(tokenizer) if chat is None else bool(chat)


def prompt_texts(tokenizer, prompts: Sequence[str], chat: bool | None = None, system: str | None = None,
                 tools: list[dict] | None = None) -> tuple[list[str], bool]:
    """The texts the model continues (the prompts, or each one as a user turn of the chat template with the
    generation prompt, after a ``system`` turn when given, ``tools`` passed to the template) and whether the template
    was applied."""
    if isinstance(prompts, str):
        raise TypeError("prompts is a list of strings, not one string")
    if not uses_chat(tokenizer, chat):
        return list(prompts), False
    from jinja2 import TemplateError

    out = []
    opening = [{"role": "system", "content": system}] if system else []
    for n, p in enumerate(prompts, 1):
        try:
            out.append(tokenizer.apply_chat_template([*opening, {"role": "user", "content": p}], tokenize=False,
                                                     add_generation_prompt=True, tools=tools))
        except TemplateError as e:
            raise UserError(f"prompt {n}: the tokenizer's chat template fails: {type(e).__name__}: {e}; fix the "
                            "template or send the raw prompt (--no-chat)") from None
    return out, True


SEED_RANGE = 2**64  # torch.manual_seed takes 0 .. 2**64 - 1


def check_settings(max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                   prefix: str = "") -> None:
    """The generation settings, before any model loads: UserError naming the setting (``prefix`` + its name, e.g.
    ``--`` for the command line's ``--max-new-tokens``)."""
    def name(key: str) -> str:
        return prefix + (key.replace("_", "-") if prefix == "--" else key)

    if max_new_tokens < 1:
        raise UserError(f"{name('max_new_tokens')} must be at least 1 (got {max_new_tokens})")
    for key, value in (("temperature", temperature), ("top_p", top_p)):
        if not math.isfinite(value):
            raise UserError(f"{name(key)} must be a finite number (got {value})")
    if temperature < 0:
        raise UserError(f"{name('temperature')} must be 0 (greedy) or more (got {temperature})")
    if not 0 < top_p <= 1:
        raise UserError(f"{name('top_p')} must be in (0, 1] (got {top_p})")
    if seed is not None and not 0 <= seed < SEED_RANGE:
        raise UserError(f"{name('seed')} {seed} is out of range: give a whole number from 0 to 2**64 - 1")


def check_room(lengths: Sequence[int], max_new_tokens: int, limit: tuple[int, str] | None,
               key: str = "max_new_tokens") -> None:
    """The longest prompt plus ``max_new_tokens`` must fit the model's positions (``limit``: (positions, where the
    number comes from), None when the config has none): UserError naming ``key`` and the most it can be."""
    if limit is None:
        return
    positions, source = limit
    longest = max(lengths, default=0)
    if longest + max_new_tokens > positions:
        room = positions - longest
        most = f"so at most {room} new tokens" if room > 0 else "so no room for new tokens: shorten the prompt"
        raise UserError(f"{key}={max_new_tokens} is more than the model takes: its config has {source}, and the "
                        f"longest prompt is {longest} tokens, {most}")


def prompt_lengths(tokenizer, texts: Sequence[str], templated: bool) -> list[int]:
    """Tokens of each prompt text as ``continuations`` encodes it."""
    return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=not templated)["input_ids"]]
