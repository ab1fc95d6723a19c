"""Memory planner: what a training step holds, line by line, and the largest micro-batch that fits a budget.

    total = parameters + gradients + optimizer state + activations(micro batch, longest sequence)

Parameters and gradients come from the model's tensors, the optimizer state from bytes per trainable parameter
(AdamW: two fp32 moments). Activations are *measured*: one forward pass at micro-batch 1 and one at 2 on the
longest sequence of the data, counting the bytes of every tensor autograd saves for backward (distinct storages,
in the run's precision and with gradient checkpointing when it is on), extrapolated linearly in the batch size.
A margin covers what the count leaves out (backward's transient buffers, allocator slack).

On CPU an out-of-memory is a SIGKILL that cannot be caught, so ``train.micro_batch_size=auto`` plans against
``efficiency.memory_budget`` (default: half the available RAM, shared by the local processes). On CUDA it probes:
a real forward/backward at each candidate size, largest first, catching the out-of-memory error.
"""

from __future__ import annotations

import logging
import os
import re
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from leantrain.config import Config
from leantrain.errors import ConfigError, UserError

log = logging.getLogger("leantrain")

MARGIN = 0.25  # planned total x (1 + MARGIN) must fit the budget
RAM_SHARE = 0.5  # default CPU budget: this share of the available RAM, divided by the local processes
OPTIMIZER_STATE_BYTES = {"adamw": 8}  # per trainable parameter (exp_avg + exp_avg_sq in fp32)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: int | str) -> int:
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"efficiency.memory_budget: expected bytes or a size such as 4GiB or 500MB (got {value!r})")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


@dataclass
class ActivationProfile:
    """Bytes saved for backward: ``fixed + per_example * micro_batch`` at ``seq_len`` tokens."""

    seq_len: int
    fixed: int
    per_example: int

    def at(self, micro_batch_size: int) -> int:
        return max(0, self.fixed + self.per_example * micro_batch_size)


def _saved_bytes(model, batch: int, seq_len: int, autocast) -> int:
    """Bytes of the distinct storages autograd saves in one forward pass of a (batch, seq_len) input.
    ``autocast``: a callable returning the run's autocast context (e.g. ``accelerator.autocast``)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    device = next(model.parameters()).device
    vocab = getattr(model.config, "vocab_size", 1000) or 1000
    ids = torch.randint(min(1000, vocab - 1), vocab, (batch, seq_len), device=device)
    with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            (autocast or nullcontext)():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
        del out
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params)


def measure_activations(model, seq_len: int, autocast=None) -> ActivationProfile:
    was_training = model.training
    model.train()
    one, two = (_saved_bytes(model, b, seq_len, autocast) for b in (1, 2))
    model.train(was_training)
    return ActivationProfile(seq_len, fixed=2 * one - two, per_example=two - one)


def memory_plan(cfg: Config, model, micro_batch_size: int, activations: ActivationProfile) -> dict[str, int]:
    """Bytes per line of one training process at ``micro_batch_size``; ``total`` sums them (no margin)."""
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    per_param = OPTIMIZER_STATE_BYTES.get(cfg.optim.name, 8)
    plan = {
        "parameters": sum(p.numel() * p.element_size() for p in params),
        "gradients": sum(p.numel() * p.element_size() for p in trainable),
        "optimizer_state": sum(p.numel() for p in trainable) * per_param,
        "activations": activations.at(micro_batch_size),
    }
    plan["total"] = sum(plan.values())
    return plan


def default_budget(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return total, f"{torch.cuda.get_device_name(device)} memory"
    import psutil

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    avail = psutil.virtual_memory().available
    return int(avail * RAM_SHARE / local), f"{RAM_SHARE:.0%} of {gib(avail)} available RAM / {local} local process(es)"


def divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def longest_sequence(cfg: Config, inputs) -> int:
    return cfg.data.max_length if cfg.data.batching == "padded" else int(max(inputs.train["length"]))


def plan_micro_batch(cfg: Config, model, per_process: int, seq_len: int, budget: int, autocast=None) -> tuple[int, str]:
    """The largest divisor of the per-process batch whose planned memory (with the margin) fits the budget."""
    profile = measure_activations(model, seq_len, autocast)
    for m in divisors_desc(per_process):
        need = memory_plan(cfg, model, m, profile)["total"] * (1 + MARGIN)
        if need <= budget:
            bigger = [d for d in divisors_desc(per_process) if d > m]
            why = f"planned {gib(need)} incl. {MARGIN:.0%} margin at {seq_len} tokens"
            if bigger:
                why += f"; {bigger[-1]} would need {gib(memory_plan(cfg, model, bigger[-1], profile)['total'] * (1 + MARGIN))}"
            return m, why
    one = memory_plan(cfg, model, 1, profile)
    raise UserError(
        f"train.micro_batch_size=auto: even a micro-batch of 1 needs {gib(one['total'] * (1 + MARGIN))} "
        f"({', '.join(f'{k} {gib(v)}' for k, v in one.items() if k != 'total')}, +{MARGIN:.0%}) over the budget of "
        f"{gib(budget)}; raise efficiency.memory_budget, or turn on efficiency.gradient_checkpointing / "
        "efficiency.precision=bf16, or lower data.max_length"
    )


def probe_micro_batch(model, per_process: int, seq_len: int, budget: int, autocast=None) -> tuple[int, str]:
    """CUDA: a real forward/backward at each divisor, largest first; the first that neither raises an
    out-of-memory nor passes the budget wins."""
    device = next(model.parameters()).device
    vocab = getattr(model.config, "vocab_size", 1000) or 1000
    for m in divisors_desc(per_process):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            ids = torch.randint(0, vocab, (m, seq_len), device=device)
            with torch.random.fork_rng(devices=[device]), (autocast or nullcontext)():
                model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().sum().backward()
            peak = torch.cuda.max_memory_allocated(device)
        except torch.cuda.OutOfMemoryError:
            peak = None
        finally:
            model.zero_grad(set_to_none=True)
        if peak is not None and peak * (1 + MARGIN / 2) <= budget:  # + optimizer state, allocated at the first step
            return m, f"probed: peak {gib(peak)} at {seq_len} tokens"
    raise UserError(f"train.micro_batch_size=auto: a micro-batch of 1 at {seq_len} tokens does not fit {gib(budget)}; "
                    "turn on efficiency.gradient_checkpointing, use bf16, or lower data.max_length")


def auto_micro_batch(cfg: Config, model, inputs, accelerator, plan) -> int:
    """``train.micro_batch_size=auto``: chosen on rank 0 and broadcast, so that every rank agrees."""
    from accelerate.utils import broadcast_object_list

    per_process = plan.batch_size // plan.world_size
    choice = [None]
    if accelerator.is_main_process:
        budget, source = ((parse_bytes(cfg.efficiency.memory_budget), "efficiency.memory_budget")
                          if cfg.efficiency.memory_budget is not None else default_budget(accelerator.device))
        seq_len = longest_sequence(cfg, inputs)
        model.to(accelerator.device)
        search = probe_micro_batch if accelerator.device.type == "cuda" else plan_micro_batch
        args = (model, per_process, seq_len, budget) if search is probe_micro_batch else (cfg, model, per_process, seq_len, budget)
        micro, why = search(*args, autocast=accelerator.autocast)
        log.info("micro batch auto: %d of %d per process (%s; budget %s from %s)", micro, per_process, why,
                 gib(budget), source)
        choice = [micro]
    if accelerator.num_processes > 1:
        broadcast_object_list(choice, from_process=0)
    return int(choice[0])
