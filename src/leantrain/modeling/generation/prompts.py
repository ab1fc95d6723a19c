"""Continuations of prompts by a causal LM: what ``leantrain generate`` prints and ``report.sample_prompts`` logs.

``continuations(model, tokenizer, prompts, max_new_tokens=...)`` returns only the new text of each prompt:

- greedy by default (``temperature=0``); ``temperature > 0`` samples (nucleus sampling with ``top_p``), seeded by
  ``seed`` in a forked RNG, so the same seed gives the same text and the caller's random state (a training run's)
  is left as it was;
- the tokenizer's chat template, when it has one and ``chat`` is not False, wraps each prompt as one user turn with
  the generation prompt (the assistant's turn opened), after a system turn of ``system`` when given and with the
  ``tools`` schemas passed to the template (``leantrain.data.lm.sft.sample_inputs``: both as the run trained with
  them); ``chat=True`` without a template is an error;
- prompts run in batches, padded on the left (the new tokens of every row start at the same position); a tokenizer
  without a pad token pads with its EOS token, for the call only;
- the model is put in eval mode for the call and back in train mode after when it was training;
- a long generation reports its new tokens to the open ``heartbeat`` sink (``leantrain generate``, sample prompts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from leantrain.errors import UserError
from leantrain.heartbeat import Work, work
from leantrain.modeling.wrappers import unwrapped


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


def _generation_config(model, tokenizer, max_new_tokens: int, temperature: float, top_p: float):
    """A generation config of our own (the model's may ask for sampling, top_k, a repetition penalty, ...): only
    what the caller asked for, with the model's special token ids."""
    from transformers import GenerationConfig

    own = getattr(model, "generation_config", None)

    def token_id(name: str):
        value = getattr(own, name, None) if own is not None else None
        return value if value is not None else getattr(model.config, name, None)

    eos = token_id("eos_token_id")
    if eos is None:
        eos = tokenizer.eos_token_id
    sample = temperature > 0
    return GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature if sample else None,
        top_p=top_p if sample else None, top_k=0 if sample else None, num_beams=1,
        eos_token_id=eos, bos_token_id=token_id("bos_token_id"),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)


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


class Ticks:
    """transformers' streamer protocol (``put`` the prompt, then each new token; ``end``) counting the new tokens of
    a ``generate`` call into a ``heartbeat`` work. Only where a sink is open (``of``): transformers copies each token
    to the host for a streamer."""

    def __init__(self, progress: Work):
        self.progress, self.seen = progress, -1  # the first put is the prompt

    @classmethod
    def of(cls, progress: Work) -> "Ticks | None":
        return cls(progress) if progress.sink is not None else None

    def put(self, value: torch.Tensor) -> None:
        self.seen += 1
        if self.seen and self.progress.due():
            self.progress.update(self.seen)

    def end(self) -> None:
        pass


def continuations(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, chat: bool | None = None,
                  system: str | None = None, tools: list[dict] | None = None, temperature: float = 0.0,
                  top_p: float = 1.0, seed: int | None = None, batch_size: int = 16) -> list[str]:
    """The new text the model writes after each prompt (see the module docstring), in the prompts' order."""
    check_settings(max_new_tokens, temperature, top_p, seed)
    texts, templated = prompt_texts(tokenizer, prompts, chat, system, tools)
    if tokenizer.pad_token is None and tokenizer.eos_token is None and len(texts) > 1:
        raise UserError("the tokenizer has neither a pad token nor an EOS token, so several prompts cannot be "
                        "padded into one batch; give one prompt at a time")
    model = unwrapped(model)  # DDP, compile: generate on the wrapped model (the same weights)
    device = next(model.parameters()).device
    config = _generation_config(model, tokenizer, max_new_tokens, temperature, top_p)
    side, pad = tokenizer.padding_side, tokenizer.pad_token
    training = model.training
    devices = [device] if device.type == "cuda" else []
    try:
        tokenizer.padding_side = "left"
        if pad is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.eval()
        out: list[str] = []
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"), \
                torch.no_grad():  # not inference_mode: FSDP2 would keep inference tensors as its gathered weights
            if seed is not None:
                torch.manual_seed(seed)
            for start in range(0, len(texts), batch_size):
                # a template writes its own special tokens (BOS); plain prompts get the tokenizer's
                enc = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True,
                                add_special_tokens=not templated, return_token_type_ids=False).to(device)
                with work(f"generation of prompts {start + 1}-{start + len(enc['input_ids'])} of "
                                    f"{len(texts)}", max_new_tokens, "tokens", may_end_early=True) as progress:
                    ids = model.generate(**enc, generation_config=config, streamer=Ticks.of(progress))
                out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return out
    finally:
        tokenizer.padding_side = side
        if pad is None:
            tokenizer.pad_token = None
        model.train(training)
