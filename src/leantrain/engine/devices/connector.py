"""The one place that decides every fast path of a command's model, and says what it chose and why (Lightning
Fabric's connector): ``choose_paths(model, ctx)`` for ``train``, ``eval``, ``generate`` and ``plan`` alike, on the
model as built (LoRA applied, not yet placed on the processes), returns the record (``Paths``, ``paths.py``):

1. ``attention``: the implementation the built model uses (train and plan chose it before building the model:
   ``efficiency.resolve_model_choices``; eval and generate: as the model loaded);
2. the converters the command makes, in their declared order (``converters.py``: dropout, weight casts, the output
   loss, gradient checkpointing; compile decided here and made by ``finish_paths`` once the memory planner has
   measured the eager model);
3. the forward paths the method and the command take (``modeling/fast_paths.py``): the decode step where the command
   generates (GRPO, ``report.sample_prompts``, ``leantrain generate``, a GRPO model's evaluation), GRPO's shared-prompt
   forward (training), a BERT reward model's first-token last layer. Each path's probe is asked here, once, with the
   strategy that will wrap or shard the model, and the decision is written on the model, where its forward reads it
   (a copy of the model, a frozen reference, takes the same decision).
"""

from __future__ import annotations

from torch import nn

from leantrain.engine.devices.converters import ordered
from leantrain.engine.devices.paths import Choice, Paths, PathsContext
from leantrain.modeling import first_token
from leantrain.modeling.fast_paths import (DECODE_STEP, FIRST_TOKEN, FORWARD_PATHS, SHARED_PROMPTS, decide,
                                           prompt_cache_refusal)
from leantrain.modeling.generation.decode_step import TRANSFORMERS, decode_step
from leantrain.modeling.wrappers import unwrapped

SHARDING = ("fsdp",)  # strategies that shard the weights themselves (FSDP2's DTensors)
WRAPPING = ("fsdp", "deepspeed")  # strategies whose wrapper or sharded modules do not pass a cache through a forward


def choose_paths(model: nn.Module, ctx: PathsContext) -> Paths:
    """Decide (and make, where the command makes them) the fast paths of ``model`` in ``ctx``: the record, in the
    module docstring's order."""
    paths = Paths()
    paths.add("attention", attention(model, ctx))
    for converter in ordered():
        if not converter.concerns(ctx.command):
            continue
        choice = converter.decide(model, ctx)
        if choice is not None and choice.change and converter.makes(ctx.command) and not converter.late:
            choice = converter.convert(model, ctx, choice)
        paths.add(converter.name, choice)
    for path in forward_paths(ctx):
        paths.add(path, FORWARD[path](model, ctx))
    return paths


def finish_paths(model: nn.Module, ctx: PathsContext, paths: Paths) -> None:
    """The late converters (compile), made on ``model`` as ``paths`` decided them; their entries replaced by what was
    made."""
    for converter in ordered():
        choice = paths.choices.get(converter.name)
        if converter.late and converter.makes(ctx.command) and choice is not None and choice.change:
            paths.add(converter.name, converter.convert(model, ctx, choice))


def attention(model: nn.Module, ctx: PathsContext) -> Choice:
    impl = getattr(unwrapped(model).config, "_attn_implementation", None) or "default"
    if ctx.choices is not None:
        return Choice.of("attention", impl, ctx.choices.attention_reason)
    return Choice.of("attention", impl, f"as {type(unwrapped(model)).__name__} loaded (transformers' choice)")


def forward_paths(ctx: PathsContext) -> list[str]:
    """The forward paths ``ctx``'s command takes: the method's (``traits.forward_paths``), the decode step where the
    command generates besides; the shared-prompt forward only where it trains (or prices training)."""
    wanted = set(ctx.traits.forward_paths if ctx.traits is not None else ())
    if ctx.generates:
        wanted.add(DECODE_STEP)
    if not ctx.trains:
        wanted.discard(SHARED_PROMPTS)
    return [p for p in FORWARD_PATHS if p in wanted]


def decode(model: nn.Module, ctx: PathsContext) -> Choice:
    """The decode step of generation (``modeling/generation/decode_step.py``): fused for a Llama-shaped model of plain
    layers with whole weights, else transformers' forward (the cache's own conditions are checked as it is made)."""
    if ctx.strategy in SHARDING:
        name, why = TRANSFORMERS, f"distributed.strategy={ctx.strategy} shards the weights: transformers' forward"
    else:
        name, why = decode_step(unwrapped(model))[1:]
    decide(model, DECODE_STEP, name)
    return Choice.of("decode step", name, why)


def shared_prompts(model: nn.Module, ctx: PathsContext) -> Choice:
    """GRPO's shared-prompt forward (``methods/grpo/forward.py``): where the forward can carry the prompts' cache
    through the backward. The model carries that answer; its forward also never shares under gradient checkpointing
    (the memory planner switches it on and off), which the record says where the run configures it."""
    why = (f"distributed.strategy={ctx.strategy} wraps the model: its forward does not pass the cache through"
           if ctx.strategy in WRAPPING else prompt_cache_refusal(model))
    decide(model, SHARED_PROMPTS, why is None)
    if why is None and ctx.efficiency is not None and ctx.efficiency.gradient_checkpointing:
        why = "gradient checkpointing drops the cache (efficiency.gradient_checkpointing=true)"
    return Choice.of("shared-prompt forward", why is None,
                     why or "each prompt encoded once for its completions, its cache carried through the backward")


def first_token_layer(model: nn.Module, ctx: PathsContext) -> Choice:
    """A BERT reward model's last layer for the first token only (``modeling/first_token.py``)."""
    why = (f"distributed.strategy={ctx.strategy}: its sharded layers are not BERT's classes"
           if ctx.strategy in SHARDING else first_token.refusal(unwrapped(model)))
    decide(model, FIRST_TOKEN, why is None)
    return Choice.of("first-token last layer", why is None,
                     why or "the pooler reads the first token alone: the last layer computes that token only")


FORWARD = {DECODE_STEP: decode, SHARED_PROMPTS: shared_prompts, FIRST_TOKEN: first_token_layer}
