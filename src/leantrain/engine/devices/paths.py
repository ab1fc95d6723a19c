"""The record of a command's fast paths: what was chosen for each, and why (``Paths``: name -> ``Choice``), and what
they are decided from (``PathsContext``). Made by one function for ``train``, ``eval``, ``generate`` and ``plan``
alike, the connector's ``choose_paths`` (``engine/devices/connector.py``); its lines open the log, its ``record()`` is
``summary.json``'s ``paths`` (train), ``leantrain eval``'s and ``leantrain generate --json``'s ``paths`` and
``leantrain plan``'s.

The entries, in this order, each present only where it concerns the command and the model: ``attention`` (the
attention implementation), ``dropout``, ``weight_casts``, ``output_loss`` (the chunked loss, Liger's kernel or the
plain logits), ``gradient_checkpointing``, ``compile``, ``decode_step`` (``fused`` or ``transformers``),
``shared_prompts`` (GRPO's forward) and ``first_token`` (a BERT reward model's last layer)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leantrain.config import EfficiencyConfig
from leantrain.engine.devices.efficiency import ModelChoices
from leantrain.methods import Traits

COMMANDS = ("train", "plan", "eval", "generate")


@dataclass(frozen=True)
class Choice:
    """One path's value (a name such as ``sdpa`` or ``fused``; True / False for a switch) and why. ``line``: its log
    line; ``change``: (a converter's decision) the change is still to be made (``Converter.convert``)."""

    value: object
    reason: str
    line: str
    change: bool = False

    @classmethod
    def of(cls, label: str, value, reason: str, said: str | None = None, change: bool = False) -> Choice:
        """A choice whose line reads ``label: said (reason)``; ``said`` defaults to the value (on / off for a
        switch)."""
        said = said if said is not None else ("on" if value is True else "off" if value is False else str(value))
        return cls(value, reason, f"{label}: {said} ({reason})", change)

    def record(self) -> dict:
        return {"value": self.value, "reason": self.reason}


class Paths:
    """The choices of one command, in the order they were made: ``lines()`` for the log, ``record()`` for the JSON
    outputs."""

    def __init__(self) -> None:
        self.choices: dict[str, Choice] = {}

    def add(self, name: str, choice: Choice | None) -> None:
        """Record ``choice`` for ``name`` (a later choice of a name replaces the earlier, in its place); None: the
        path does not concern this command or model, and is left out."""
        if choice is not None:
            self.choices[name] = choice

    def __getitem__(self, name: str) -> Choice:
        return self.choices[name]

    def __contains__(self, name: str) -> bool:
        return name in self.choices

    def lines(self) -> list[str]:
        return [c.line for c in self.choices.values()]

    def record(self) -> dict:
        """``{name: {"value": ..., "reason": ...}}``."""
        return {name: c.record() for name, c in self.choices.items()}


@dataclass(frozen=True)
class PathsContext:
    """What one command's fast paths are decided from: ``command`` (one of ``COMMANDS``), the device; for the commands
    that train or price training, ``efficiency`` (the config's section) and ``choices`` (attention, compile and weight
    casts, resolved before the model was built); the method's ``traits`` (dropout kept or not, the loss's token
    gradients, the forward paths it takes); ``strategy`` as resolved for the processes (``none``, ``ddp``, ``fsdp``,
    ``deepspeed``: what will wrap or shard the model); ``generates``: the run generates beside its method
    (``report.sample_prompts``; ``leantrain generate``); the micro-batch and block size the output loss is sized for."""

    command: str
    device: torch.device
    efficiency: EfficiencyConfig | None = None
    choices: ModelChoices | None = None
    traits: Traits | None = None
    strategy: str = "none"
    generates: bool = False
    micro_batch: int | str | None = None
    block_size: int | None = None

    def __post_init__(self):
        if self.command not in COMMANDS:
            raise ValueError(f"command {self.command!r}: one of {', '.join(COMMANDS)}")

    @property
    def trains(self) -> bool:
        """The command trains the model (``train``) or prices its training (``plan``)."""
        return self.command in ("train", "plan")
