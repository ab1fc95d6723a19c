"""The optional changes a command makes to its model before it runs, as converters (torchtitan's ``ModelConverter``):
each a ``Converter`` with a ``name`` (its entry in the record of fast paths, ``engine/devices/paths.py``), ``decide``
(whether it applies to this model in this command, and why; nothing changed), ``convert`` (the change, and what it
did), the commands that make it, and ``after``: the converters whose change must be made before its own. The
connector (``engine/devices/connector.py``) applies them in ``ordered(CONVERTERS)``, the order ``after`` declares:

- ``dropout``: ``preference.dropout=off``'s p = 0 (TRL's disable_dropout), else ``efficiency.dropout``'s fast CPU
  dropout (``engine/devices/dropout.py``);
- ``weight_casts``: autocast's weight casts made again in the backward (``modeling/weight_casts.py``);
- ``output_loss``: ``efficiency.chunked_loss``, the chunked loss or Liger's kernel on a causal LM's output layer: a
  mark and a pre-hook on the layer, which the weight casts' class change keeps, so the two commute
  (``tests/unit/engine/test_paths.py``);
- ``gradient_checkpointing``;
- ``compile`` (after every other, ``late``: made once the memory planner has measured the eager model and the method
  has copied its reference): the compiled graph must see every module as changed.

Where two converters declare nothing between them, either order makes the same model; ``ordered`` keeps the order of
``CONVERTERS`` then (a stable topological sort). ``leantrain plan`` decides every converter ``train`` makes and makes
the ``priced`` ones (the memory it prices depends on them; it prices gradient checkpointing both ways and the eager
model); ``leantrain eval`` makes the output loss only (the evaluation's logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from leantrain.engine.devices.dropout import disable_dropout, resolve_dropout, use_fast_dropout
from leantrain.engine.devices.efficiency import install_output_loss
from leantrain.engine.devices.paths import Choice, PathsContext
from leantrain.modeling.chunked_loss import is_causal_lm
from leantrain.modeling.switches import enable_checkpointing
from leantrain.modeling.weight_casts import install_recast


@dataclass(frozen=True)
class Converter:
    """An optional change of the model (module docstring). ``decide(model, ctx)``: the choice (``change``: convert is
    to run), or None where it does not concern the model; ``convert(model, ctx, choice)``: the change made, and the
    choice as made."""

    name: str
    decide: Callable[[nn.Module, PathsContext], Choice | None]
    convert: Callable[[nn.Module, PathsContext, Choice], Choice | None]
    after: tuple[str, ...] = ()
    commands: tuple[str, ...] = ("train",)  # the commands that make the change
    priced: bool = False  # leantrain plan makes it too
    late: bool = False  # train makes it after the memory planner and the method's reference copy

    def makes(self, command: str) -> bool:
        """Whether ``command`` makes this change (plan: the priced ones)."""
        return command in self.commands or (command == "plan" and self.priced)

    def concerns(self, command: str) -> bool:
        """Whether ``command``'s record has this converter's entry (plan: every one train makes)."""
        return self.makes(command) or (command == "plan" and "train" in self.commands)


# --------------------------------------------------------------------------------------------------------- dropout


def decide_dropout(model: nn.Module, ctx: PathsContext) -> Choice | None:
    if ctx.efficiency is None or ctx.traits is None:
        return None
    if not ctx.traits.keeps_dropout:
        if not any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
            return None
        return Choice.of("dropout", "off", "preference.dropout=off, as TRL's disable_dropout", change=True)
    if not any(type(m) is nn.Dropout and m.p > 0 for m in model.modules()):
        return None
    requested = ctx.efficiency.dropout
    mode = resolve_dropout(requested, ctx.device.type)
    why = f"efficiency.dropout={requested}" + (f": {mode} on {ctx.device.type}" if requested == "auto" else "")
    return Choice.of("dropout", mode, why, change=mode == "fast")


def convert_dropout(model: nn.Module, ctx: PathsContext, choice: Choice) -> Choice:
    if choice.value == "off":
        return Choice.of("dropout", "off", choice.reason, said=f"off in {disable_dropout(model)} modules")
    swapped = use_fast_dropout(model)
    return Choice.of("dropout", "fast", f"{choice.reason}; {swapped} nn.Dropout modules, masks 4 elements per "
                     "random draw")


# ---------------------------------------------------------------------------------------------------- weight casts


def decide_recast(model: nn.Module, ctx: PathsContext) -> Choice | None:
    c = ctx.choices
    if c is None:
        return None
    return Choice.of("weight casts", c.recast, c.recast_reason, said=None if c.recast else "kept for the backward",
                     change=c.recast)


def convert_recast(model: nn.Module, ctx: PathsContext, choice: Choice) -> Choice:
    swapped = install_recast(model)
    if not swapped:
        return Choice.of("weight casts", False, "the model has no bias-free linear layer to recast",
                         said="kept for the backward")
    return Choice.of("weight casts", True, choice.reason, said=f"made again in the backward in {swapped} linear layers")


# ----------------------------------------------------------------------------------------------------- output loss


def decide_output_loss(model: nn.Module, ctx: PathsContext) -> Choice | None:
    """The kind is chosen as the layer is installed (``install_output_loss``): a choice to convert for a causal LM
    (or a chunked loss asked of any model: its error names why not)."""
    if ctx.efficiency is None:
        return None
    setting = ctx.efficiency.chunked_loss
    if setting is not True and not is_causal_lm(model):
        return None
    return Choice.of("output loss", setting, f"efficiency.chunked_loss={setting}", change=True)


def convert_output_loss(model: nn.Module, ctx: PathsContext, choice: Choice) -> Choice | None:
    note = install_output_loss(model, ctx.efficiency, ctx.device, ctx.micro_batch, ctx.block_size,
                               ctx.traits.uniform_token_gradients)
    return None if note is None else Choice(note.kind, note.reason, str(note))


# ------------------------------------------------------------------------------------------ gradient checkpointing


def decide_checkpointing(model: nn.Module, ctx: PathsContext) -> Choice | None:
    if ctx.efficiency is None:
        return None
    on = ctx.efficiency.gradient_checkpointing
    return Choice.of("gradient checkpointing", on, f"efficiency.gradient_checkpointing={str(on).lower()}", change=on)


def convert_checkpointing(model: nn.Module, ctx: PathsContext, choice: Choice) -> Choice:
    enable_checkpointing(model)
    return Choice.of("gradient checkpointing", True, "non-reentrant; activations recomputed in backward")


# --------------------------------------------------------------------------------------------------------- compile


def decide_compile(model: nn.Module, ctx: PathsContext) -> Choice | None:
    c = ctx.choices
    return None if c is None else Choice.of("torch.compile", c.compile, c.compile_reason, change=c.compile)


def convert_compile(model: nn.Module, ctx: PathsContext, choice: Choice) -> Choice:
    """torch.compile in place, before ``accelerator.prepare``. Compilation is lazy: it happens in the first steps
    (left out of the throughput), and ``compile_seconds()`` reports it separately."""
    model.compile()  # in place: the module keeps its class, state_dict keys and save_pretrained
    return Choice.of("torch.compile", True, f"{choice.reason}; compiled lazily in the first steps, recompiles once for "
                     "dynamic shapes")


CONVERTERS = (
    Converter("dropout", decide_dropout, convert_dropout),
    Converter("weight_casts", decide_recast, convert_recast, priced=True),
    Converter("output_loss", decide_output_loss, convert_output_loss, commands=("train", "eval"), priced=True),
    Converter("gradient_checkpointing", decide_checkpointing, convert_checkpointing),
    Converter("compile", decide_compile, convert_compile, late=True,
              after=("dropout", "weight_casts", "output_loss", "gradient_checkpointing")),
)


def ordered(converters=CONVERTERS) -> list[Converter]:
    """``converters`` in an order where each comes after every converter its ``after`` names (the order given where
    they declare nothing); a ValueError for a name no converter has, or a cycle."""
    names = {c.name for c in converters}
    unknown = sorted({a for c in converters for a in c.after} - names)
    if unknown:
        raise ValueError(f"converters: 'after' names no converter: {', '.join(unknown)}")
    done: list[Converter] = []
    left = list(converters)
    while left:
        ready = next((c for c in left if all(a in {d.name for d in done} for a in c.after)), None)
        if ready is None:
            raise ValueError(f"converters: a cycle in 'after' among {', '.join(c.name for c in left)}")
        done.append(ready)
        left.remove(ready)
    return done
