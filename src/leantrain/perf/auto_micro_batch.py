"""Automatic micro-batch size (``train.micro_batch_size=auto``) and the memory-budget helpers it shares with
``leantrain plan``.

The memory model itself (framework overhead, parameters, gradients, optimizer state, casts, activations,
temporary buffers: each measured or counted) lives in ``leantrain.perf.memory_model``, shared with ``leantrain plan``,
so the two never disagree. A margin (on the predicted training part, not on the measured framework overhead)
covers what a prediction can miss.

On CPU an out-of-memory is a SIGKILL that cannot be caught, so ``train.micro_batch_size=auto`` sizes against
``efficiency.memory_budget`` (default: half the available RAM, shared by the local processes; compared
with the whole process's predicted peak). On CUDA it probes:
a real forward/backward at each candidate size, largest first, catching the out-of-memory error.
"""

from __future__ import annotations

import logging
import os
import re
from contextlib import nullcontext

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list
from torch import nn

from leantrain.config import Config
from leantrain.errors import ConfigError, UserError
from leantrain.perf import memory_model
from leantrain.perf.memory import current_rss_bytes
from leantrain.units import format_bytes

log = logging.getLogger("leantrain")

MARGIN = 0.25  # predicted total x (1 + MARGIN) must fit the budget
# What a whole run adds on top of the planned training step, which the step's lines do not model: evaluation at 2x
# the micro-batch, saving, the loss-curve plot, and on CPU the reuse allocator (efficiency.cpu_allocator=reuse) keeping
# freed transients resident. Measured (MiniLM, demo data, 35 tokens, bf16, CPU, 6 steps): whole-run peaks of
# 1.106 / 1.120 GiB at micro-batches 8 / 16 (1.052 GiB at 16 with the system allocator), 80-153 MB above the predicted
# lines; the 25% margin alone missed (a 1.2 GiB budget was overshot by 13 MB). tests/unit/commands/test_plan_noise.py keeps them.
RUN_ALLOWANCE = 128 * 2**20
RAM_SHARE = 0.5  # default CPU budget: this share of the available RAM, divided by the local processes
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value: int | str) -> int:
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"efficiency.memory_budget: expected bytes or a size such as 4GiB or 500MB (got {value!r})")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def need_bytes(lines: dict[str, int]) -> int:
    """Predicted peak with the margin on what the training adds (the framework overhead is measured, not predicted) and
    the allowance for what the run does besides training steps (``RUN_ALLOWANCE``)."""
    return int(lines["total"] + MARGIN * (lines["total"] - lines["framework_overhead"]) + RUN_ALLOWANCE)


def framework_bytes(model, plots: bool = False) -> int:
    """What this process holds besides the model's parameters, now (RSS on CPU, allocated bytes on CUDA), with the
    plotting library the run loads at its end when ``plots`` (resident from then on, so part of the peak)."""
    device = next(model.parameters()).device
    if plots and device.type == "cpu":
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    return max(0, memory_model.resident_bytes(device) - sum(p.numel() * p.element_size() for p in model.parameters()))


def default_budget(device: torch.device, local: int | None = None) -> tuple[int, str]:
    """Per-process budget for the whole process's peak: the GPU's memory, or on CPU a safe share of the RAM
    available now plus what this process already holds (it counts in the peak), shared by the local processes."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return total, f"{torch.cuda.get_device_name(device)} memory"
    import psutil  # lazy: only the CPU budget needs it

    local = local or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    avail = psutil.virtual_memory().available + current_rss_bytes()
    return int(avail * RAM_SHARE / local), f"{RAM_SHARE:.0%} of {format_bytes(avail)} available RAM / {local} local process(es)"


def divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def longest_sequence(cfg: Config, data) -> int:
    """The sequence length the memory is sized for: data.max_length when padded, else the longest example; plus the
    tokens an online method generates after each (GRPO: its training rows are a prompt and a completion)."""
    longest = cfg.data.max_length if cfg.data.batching == "padded" else int(max(data.train["length"]))
    generated = data.task.data.generated_tokens()
    return longest + (generated[0] if generated else 0)


def fit_micro_batch(cfg: Config, model, task, per_process: int, seq_len: int, budget: int, precision: str = "fp32",
                    calibration=None, facts=None) -> tuple[int, str]:
    """The largest divisor of the per-process batch whose predicted peak (``leantrain plan``'s lines, with the
    margin) fits the budget, measured through ``task.forward_loss``. ``calibration`` / ``facts``: already measured
    (else measured here)."""
    facts = facts or memory_model.model_facts(model, framework_bytes(model, cfg.report.plots))
    ckpt = cfg.efficiency.gradient_checkpointing
    cal = calibration or memory_model.calibrate(model, seq_len, precision, ckpt, per_process, timing=False, task=task)
    state = memory_model.meta_state_bytes(model, cfg.optim)
    need = {m: need_bytes(memory_model.lines(facts, cal, m, state)) for m in divisors_desc(per_process)}
    for m in divisors_desc(per_process):
        if need[m] <= budget and m > cal.sizes[1] and calibration is None:
            # extrapolated beyond the measured size (a short pass on a busy machine): measure at m itself before
            # trusting it, since the extrapolation is what under-predicts (benchmarks/results/memory-planner.md)
            exact = memory_model.calibrate(model, seq_len, precision, ckpt, per_process, timing=False, size=m,
                                               task=task)
            need[m] = need_bytes(memory_model.lines(facts, exact, m, state))
        if need[m] <= budget:
            bigger = [d for d in divisors_desc(per_process) if d > m]
            why = (f"planned peak {format_bytes(need[m])} incl. {MARGIN:.0%} margin and {RUN_ALLOWANCE // 2**20} MiB for "
                   f"evaluation and saving, at {seq_len} tokens")
            if bigger:
                why += f"; {bigger[-1]} would need {format_bytes(need[bigger[-1]])}"
            return m, why
    one = memory_model.lines(facts, cal, 1, state)
    raise UserError(
        f"train.micro_batch_size=auto: even a micro-batch of 1 needs {format_bytes(need[1])} "
        f"({', '.join(f'{k} {format_bytes(v)}' for k, v in one.items() if k != 'total')}, +{MARGIN:.0%} of the training "
        f"part) over the budget of {format_bytes(budget)}; raise efficiency.memory_budget, or turn on "
        "efficiency.gradient_checkpointing / efficiency.precision=bf16, or lower data.max_length"
    )


def probe_micro_batch(model, task, per_process: int, seq_len: int, budget: int, autocast=None) -> tuple[int, str]:
    """CUDA: a real forward/backward (``task.forward_loss``) at each divisor, largest first; the first that neither
    raises an out-of-memory nor passes the budget wins."""
    device = next(model.parameters()).device
    for m in divisors_desc(per_process):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            batch = memory_model.model.calibration_batch(model, task, m, seq_len)
            with torch.random.fork_rng(devices=[device]), (autocast or nullcontext)():
                loss, _ = task.step.forward_loss(model, batch)
            loss.backward()
            peak = torch.cuda.max_memory_allocated(device)
        except torch.cuda.OutOfMemoryError:
            peak = None
        finally:
            model.zero_grad(set_to_none=True)
        if peak is not None and peak * (1 + MARGIN / 2) <= budget:  # + optimizer state, allocated at the first step
            return m, f"probed: peak {format_bytes(peak)} at {seq_len} tokens"
    raise UserError(f"train.micro_batch_size=auto: a micro-batch of 1 at {seq_len} tokens does not fit {format_bytes(budget)}; "
                    "turn on efficiency.gradient_checkpointing, use bf16, or lower data.max_length")


def auto_micro_batch(cfg: Config, model: nn.Module, data, accelerator: Accelerator, layout, precision: str) -> int:
    """``train.micro_batch_size=auto``: chosen on rank 0 and broadcast, so that every rank agrees. ``data``: the
    run's training data (``.train`` with a ``length`` column); ``layout``: its batch layout before the choice;
    ``precision``: the resolved one (fp32, bf16, ...)."""
    per_process = layout.batch_size // layout.world_size
    choice = [None]
    if accelerator.is_main_process:
        budget, source = ((parse_bytes(cfg.efficiency.memory_budget), "efficiency.memory_budget")
                          if cfg.efficiency.memory_budget is not None else default_budget(accelerator.device))
        seq_len = longest_sequence(cfg, data)
        model.to(accelerator.device)
        if accelerator.device.type == "cuda":
            micro, why = probe_micro_batch(model, data.task, per_process, seq_len, budget,
                                          autocast=accelerator.autocast)
        else:
            micro, why = fit_micro_batch(cfg, model, data.task, per_process, seq_len, budget, precision)
        log.info("micro batch auto: %d of %d per process (%s; budget %s from %s)", micro, per_process, why,
                 format_bytes(budget), source)
        choice = [micro]
    if accelerator.num_processes > 1:
        broadcast_object_list(choice, from_process=0)
    return int(choice[0])
