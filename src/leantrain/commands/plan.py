"""`leantrain plan`: the predicted peak memory of a config on this device, line by line, and the fastest settings
that fit a budget (micro-batch x precision x gradient checkpointing x optimizer, keeping the global batch).

It prepares the data and builds the model exactly as ``leantrain train`` does (so the framework overhead is this
process's own, measured), then calibrates with a few short forward/backward passes (``leantrain.perf.memory_model``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import statistics
import sys
from dataclasses import dataclass, field

import torch
from torch import nn

from leantrain.config import Config, resolve
from leantrain.engine.accelerator import make_accelerator, setup_logging
from leantrain.engine.distributed import strategy_name
from leantrain.engine.efficiency import resolve_precision
from leantrain.engine.preflight import check_max_length
from leantrain.engine.training_data import prepare_training_data
from leantrain.errors import UserError
from leantrain.modeling import build_model
from leantrain.modeling.chunked_loss import apply_chunked_loss
from leantrain.modeling.lora import apply_trainable
from leantrain.modeling.tasks import Task
from leantrain.perf import memory_model
from leantrain.units import format_bytes
from leantrain.perf.auto_micro_batch import (MARGIN, RUN_ALLOWANCE, default_budget, divisors_desc, framework_bytes,
                                             longest_sequence, need_bytes, parse_bytes)
from leantrain.perf.noise import rank_by_speed

log = logging.getLogger("leantrain")
TOP = 5


def available_optimizers() -> list[str]:
    names = ["adamw", "adafactor", "sgd"]
    names += ["lion"] if importlib.util.find_spec("lion_pytorch") else []
    names += ["adamw8bit"] if importlib.util.find_spec("bitsandbytes") else []
    names += ["muon"] if hasattr(torch.optim, "Muon") else []
    return names


def precisions(device: torch.device, configured: str) -> list[str]:
    if device.type == "cuda":
        return ["bf16", "fp32"] if torch.cuda.is_bf16_supported() else ["fp16", "fp32"]
    return sorted({"fp32", "bf16", configured} - {"auto"})


@dataclass
class Search:
    """What ``leantrain plan`` measures once and prices every setting with: the model's facts, a calibration per
    (precision, checkpointing), optimizer state bytes and step time per optimizer (each measured on first use)."""

    cfg: Config
    model: nn.Module
    task: Task  # whose forward_loss the calibration passes run
    facts: memory_model.ModelFacts
    seq_len: int
    per_process: int
    nproc: int
    strategy: str
    budget: int
    calibrations: dict[tuple[str, bool], memory_model.Calibration] = field(default_factory=dict)

    def calibration(self, precision: str, ckpt: bool) -> memory_model.Calibration:
        if (precision, ckpt) not in self.calibrations:
            cal = memory_model.calibrate(self.model, self.seq_len, precision, ckpt, self.per_process, timing=False,
                                         task=self.task)
            log.info("calibrated: %s, gradient checkpointing %s, micro-batches %s x %d tokens", precision,
                     "on" if ckpt else "off", cal.sizes, self.seq_len)
            self.facts.warmup_bytes = max(self.facts.warmup_bytes, cal.warmup_bytes)
            self.calibrations[precision, ckpt] = cal
        return self.calibrations[precision, ckpt]

    def state_bytes(self, name: str) -> int:
        if name not in self.facts.state_bytes:
            self.facts.state_bytes[name] = memory_model.meta_state_bytes(self.model, self._optim(name))
        return self.facts.state_bytes[name]

    def measure_step(self, name: str) -> None:
        if name not in self.facts.step_seconds:
            times = memory_model.measure_step_times(self.model, self._optim(name))
            self.facts.step_seconds[name] = statistics.median(times)
            self.facts.step_range[name] = (min(times), max(times))

    def _optim(self, name: str):
        return self.cfg.optim.model_copy(update={"name": name})

    def option(self, precision: str, ckpt: bool, name: str, micro: int) -> dict:
        """One setting, priced: its memory lines, whether it fits the budget, and its samples/s when measured."""
        cal = self.calibration(precision, ckpt)
        lines = memory_model.lines(self.facts, cal, micro, self.state_bytes(name), strategy=self.strategy,
                                   nproc=self.nproc)
        accum = self.per_process // micro
        row = {"micro_batch_size": micro, "accumulation_steps": accum, "precision": precision,
               "gradient_checkpointing": ckpt, "optimizer": name, "lines": lines, "peak_bytes": lines["total"],
               "need_bytes": need_bytes(lines), "fits": need_bytes(lines) <= self.budget}
        if name in self.facts.step_seconds:
            step = accum * cal.seconds_at(micro) + self.facts.step_seconds[name]
            fast, slow = cal.seconds_range_at(micro)
            one = self.facts.step_seconds[name]
            step_lo, step_hi = self.facts.step_range.get(name, (one, one))
            batch = self.cfg.train.batch_size
            row["samples_per_second"] = batch / step
            row["samples_per_second_range"] = [batch / (accum * slow + step_hi), batch / (accum * fast + step_lo)]
        return row


def run_plan(source: str | None, overrides: list[str], memory: str | None = None, nproc: int = 1,
             as_json: bool = False, recommend: bool = True) -> dict:
    """Prepare the data and build the model as ``leantrain train`` does, price this config's setting and (with
    ``recommend``) every micro-batch x precision x checkpointing x optimizer; print and return the result."""
    cfg = check_max_length(resolve(source, overrides))  # data.max_length within the model's position limit
    if nproc < 1:
        raise UserError(f"--nproc must be at least 1 (got {nproc})")
    accelerator = make_accelerator(cfg, None, "no")
    setup_logging(True)
    device = accelerator.device
    precision = resolve_precision(cfg.efficiency.precision, device.type)[0]
    data = prepare_training_data(cfg, accelerator)
    per_process = cfg.train.batch_size // nproc
    if per_process < 1 or cfg.train.batch_size % nproc:
        raise UserError(f"train.batch_size={cfg.train.batch_size} does not divide over --nproc {nproc}")
    micro = cfg.train.micro_batch_size if isinstance(cfg.train.micro_batch_size, int) else per_process
    if per_process % micro:
        micro = max(d for d in divisors_desc(per_process) if d <= micro)
    model, trainable = apply_trainable(build_model(cfg.model, data.label_names, data.task), cfg.model, cfg.peft)
    model = model.to(device)  # LoRA (peft.*) and model.freeze as the run applies them
    chunked = apply_chunked_loss(model, cfg.efficiency.chunked_loss)  # as train does; causal LMs only
    if chunked:
        log.info(chunked)
    facts = memory_model.model_facts(model, framework_bytes(model, cfg.report.plots))
    budget, budget_source = ((parse_bytes(memory), "--memory") if memory is not None else
                             default_budget(device, local=nproc) if device.type == "cpu" else default_budget(device))
    search = Search(cfg, model, data.task_object, facts, longest_sequence(cfg, data), per_process, nproc, strategy_name(cfg, nproc),
                    budget)
    ckpt = cfg.efficiency.gradient_checkpointing
    result = {"device": str(device), "nproc": nproc, "strategy": search.strategy, "seq_len": search.seq_len,
              "global_batch": cfg.train.batch_size, "budget_bytes": budget, "budget_source": budget_source,
              "margin": MARGIN}
    _calibrate_at(search, precision, ckpt, micro)
    settings = _settings(search, device) if recommend else []
    result.update(search.option(precision, ckpt, cfg.optim.name, micro))
    if recommend:
        current = (micro, precision, ckpt, cfg.optim.name)
        result.update(_recommendations([search.option(*setting) for setting in settings], current))
    result["calibration"] = [c.__dict__ for c in search.calibrations.values()]
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["trainable_parameters"] = trainable.trainable or result["parameters"]
    if trainable.method != "none" or trainable.frozen:
        result["peft"] = trainable.record(cfg.peft)
    result.update(data.task_object.plan(model))  # the preference task: each reference choice's cost
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_plan(cfg, result)
    return result


def _calibrate_at(search: Search, precision: str, ckpt: bool, micro: int) -> None:
    """The config's own setting measured at its micro-batch rather than extrapolated to it, when the extrapolation
    says it fits the budget: on a busy machine the time-sized calibration pass is small (1-2 examples), and the
    linear extrapolation from there is what misses (benchmarks/RESULTS.md, "Memory planner"); fit_micro_batch does
    the same for train.micro_batch_size=auto."""
    cal = search.calibration(precision, ckpt)
    if micro <= cal.sizes[1]:
        return
    lines = memory_model.lines(search.facts, cal, micro, search.state_bytes(search.cfg.optim.name),
                               strategy=search.strategy, nproc=search.nproc)
    if need_bytes(lines) <= search.budget:
        search.calibrations[precision, ckpt] = memory_model.calibrate(
            search.model, search.seq_len, precision, ckpt, search.per_process, timing=False, size=micro,
            task=search.task)
        log.info("calibrated again at micro-batch %d (the size this config runs)", micro)


def _settings(search: Search, device: torch.device) -> list[tuple[str, bool, str, int]]:
    """Every (precision, checkpointing, optimizer, micro-batch) the search prices, with what they need measured."""
    cfg = search.cfg
    can_ckpt = [False, True] if getattr(search.model, "supports_gradient_checkpointing", False) else [False]
    for p in precisions(device, cfg.efficiency.precision):
        for c in can_ckpt:
            search.calibration(p, c)
    memory_model.time_calibrations(search.model, list(search.calibrations.values()), task=search.task)  # interleaved timing rounds
    for name in {cfg.optim.name, *available_optimizers()}:
        search.measure_step(name)
    return [(p, c, name, m) for p in precisions(device, cfg.efficiency.precision) for c in can_ckpt
            for name in available_optimizers() for m in divisors_desc(search.per_process)]


def _changes(row: dict, current: tuple) -> int:
    """How many settings of ``row`` differ from the config's own (ties within noise go to the fewest changes)."""
    mine = (row["micro_batch_size"], row["precision"], row["gradient_checkpointing"], row["optimizer"])
    return sum(a != b for a, b in zip(mine, current))


def _recommendations(rows: list[dict], current: tuple) -> dict:
    """The fitting settings ranked by predicted speed, but only where the measured ranges separate them
    (``perf.noise.rank_by_speed``: 'within noise' otherwise, fewest changes first)."""
    fits = rank_by_speed([r for r in rows if r["fits"]], prefer=lambda r: _changes(r, current))
    return {"recommendations": [{**r, "overrides": overrides_for(r)} for r in fits[:TOP]],
            "within_noise_of_fastest": sum(r["speed"] == "within noise" for r in fits),
            "options_considered": len(rows), "options_fitting": len(fits),
            "options": [{"overrides": overrides_for(r), "need_bytes": r["need_bytes"], "fits": r["fits"],
                         "samples_per_second": r["samples_per_second"],
                         "samples_per_second_range": r["samples_per_second_range"]} for r in rows]}


def overrides_for(row: dict) -> list[str]:
    return [f"train.micro_batch_size={row['micro_batch_size']}", f"efficiency.precision={row['precision']}",
            f"efficiency.gradient_checkpointing={str(row['gradient_checkpointing']).lower()}",
            f"optim.name={row['optimizer']}"]


def print_plan(cfg: Config, r: dict, out=sys.stdout) -> None:
    w = out.write
    trainable = r.get("trainable_parameters", r["parameters"])  # a plan --json from before LoRA has none
    trained = "" if trainable == r["parameters"] else f" ({trainable / 1e6:.2f}M trainable)"
    w(f"plan for {r['parameters'] / 1e6:.1f}M parameters{trained} on {r['device']} ({r['nproc']} process(es), strategy "
      f"{r['strategy']}): micro-batch {r['micro_batch_size']} x {r['accumulation_steps']} accumulation, "
      f"{r['seq_len']} tokens, {r['precision']}, gradient checkpointing {'on' if r['gradient_checkpointing'] else 'off'}"
      f", optimizer {r['optimizer']}\n")
    for k, v in r["lines"].items():
        label = "predicted peak (per process)" if k == "total" else k.replace("_", " ")
        w(f"  {label:<30} {v:>15,} B  {format_bytes(v):>11}\n")
    w(f"  budget {format_bytes(r['budget_bytes'])} ({r['budget_source']}): "
      f"{'fits' if r['fits'] else 'does NOT fit'} (with {MARGIN:.0%} margin on the training part and "
      f"{RUN_ALLOWANCE // 2**20} MiB for evaluation and saving: "
      f"{format_bytes(r['need_bytes'])})\n")
    if "preference" in r:
        _print_reference(r["preference"], w)
    if "recommendations" not in r:
        return
    w(f"\nfastest of {r['options_fitting']} fitting settings (of {r['options_considered']}; global batch "
      f"{r['global_batch']} kept; predicted samples/s with the range its timed passes spanned):\n")
    for i, rec in enumerate(r["recommendations"], 1):
        lo, hi = rec["samples_per_second_range"]
        w(f"  {i}. {rec['samples_per_second']:8.1f} samples/s ({lo:.1f}-{hi:.1f})  {rec['speed']:<12}  peak "
          f"{format_bytes(rec['peak_bytes']):>11}   {' '.join(rec['overrides'])}\n")
    if not r["recommendations"]:
        w("  none fits: lower data.max_length or train.batch_size, or raise --memory\n")
    elif r["recommendations"][0]["speed"] == "within noise":
        w(f"  within noise: {r['within_noise_of_fastest']} fitting setting(s) have predicted ranges that overlap the "
          "top one's, so their order is not measured: none of them is shown to be the fastest (choose among them by "
          "memory; listed from the fewest changes to your settings; a quieter machine narrows the ranges)\n")


def _print_reference(pref: dict, w) -> None:
    """The preference task's reference choices (preference.reference), the run's marked."""
    w(f"  reference (preference.loss={pref['loss']}, preference.reference={pref['reference']}), added to the above:\n")
    for name, o in pref["reference_options"].items():
        mark = "*" if name == pref["reference"] else " "
        usable = "" if o["fits_this_run"] else " (not for this run)"
        w(f"   {mark} {name:<11} +{format_bytes(o['extra_bytes']):>10}  {o['cost']}{usable}\n")
