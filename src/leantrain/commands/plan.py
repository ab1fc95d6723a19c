"""`leantrain plan`: the predicted peak memory of a config on this device, line by line, and the fastest settings
that fit a budget (micro-batch x precision x gradient checkpointing x optimizer, keeping the global batch).

It prepares the data and builds the model exactly as ``leantrain train`` does (so the framework overhead is this
process's own, measured), then prices the config in stages, cheapest first:

1. an estimate with no arithmetic: the model's forward/backward on fake tensors (``leantrain.perf.estimate``);
2. real forward/backward passes at the config's micro-batch (``leantrain.perf.memory_model``) where they are cheap
   (``CHEAP_SECONDS`` by a FLOPs estimate that counts the machine's load) or with ``--calibrate``, with progress and
   the time left; where they are not and the estimate is within ``CLOSE`` of the budget (the fit could flip), the
   plan says so and what ``--calibrate`` would cost;
3. with ``--search``: every micro-batch x precision x checkpointing x optimizer calibrated and timed (minutes on a
   CPU for a 100M-parameter model), ranked by predicted speed.
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
from leantrain.engine.devices.accelerator import make_accelerator, setup_logging
from leantrain.engine.devices.distributed import strategy_name
from leantrain.engine.devices.connector import choose_paths
from leantrain.engine.devices.efficiency import resolve_model_choices, resolve_precision
from leantrain.engine.devices.paths import PathsContext
from leantrain.engine.setup.preflight import check_max_length
from leantrain.engine.setup.training_data import prepare_training_data
from leantrain.errors import UserError
from leantrain.modeling import build_model
from leantrain.modeling.lora import apply_trainable
from leantrain.methods import Task
from leantrain.perf import estimate, memory_model
from leantrain.units import format_bytes, format_duration, format_rate
from leantrain.perf.auto_micro_batch import (MARGIN, RUN_ALLOWANCE, default_budget, divisors_desc, framework_bytes,
                                             longest_sequence, need_bytes, parse_bytes)
from leantrain.perf.noise import rank_by_speed

log = logging.getLogger("leantrain")
TOP = 5
CLOSE = 0.10  # the estimate's error allowed for: where the fit could flip within it, the plan says to calibrate
CHEAP_SECONDS = 20.0  # real passes that take about this long at most run by themselves (the allocator's share)


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
    estimates: dict[tuple[str, bool], memory_model.Calibration] = field(default_factory=dict)

    def estimate(self, precision: str, ckpt: bool) -> memory_model.Calibration:
        """Stage 1: fake-tensor passes (no arithmetic; seconds even for a 100M-parameter model)."""
        if (precision, ckpt) not in self.estimates:
            self.estimates[precision, ckpt] = estimate.estimate(self.model, self.seq_len, precision, ckpt,
                                                                task=self.task)
        return self.estimates[precision, ckpt]

    def calibration(self, precision: str, ckpt: bool, size: int | None = None) -> memory_model.Calibration:
        """Real forward/backward passes (at ``size`` when given, replacing an earlier calibration), with progress."""
        if (precision, ckpt) not in self.calibrations or size:
            what = f"{precision}, gradient checkpointing {'on' if ckpt else 'off'}"
            cal = memory_model.calibrate(self.model, self.seq_len, precision, ckpt, self.per_process, timing=False,
                                         size=size, task=self.task,
                                         progress=lambda text: log.info("calibrating %s: %s", what, text))
            log.info("calibrated: %s, micro-batches %s x %d tokens", what, cal.sizes, self.seq_len)
            self.facts.warmup_bytes = max(self.facts.warmup_bytes, cal.warmup_bytes)
            self.calibrations[precision, ckpt] = cal
        return self.calibrations[precision, ckpt]

    def best(self, precision: str, ckpt: bool) -> memory_model.Calibration:
        """The measured calibration where there is one, else the estimate."""
        return self.calibrations.get((precision, ckpt)) or self.estimate(precision, ckpt)

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
        """One setting, priced: its memory lines, whether it fits the budget, and its samples/s when measured (a
        causal LM's tokens/s too: samples are blocks of ``seq_len`` tokens)."""
        cal = self.best(precision, ckpt)
        lines = memory_model.lines(self.facts, cal, micro, self.state_bytes(name), strategy=self.strategy,
                                   nproc=self.nproc)
        accum = self.per_process // micro
        row = {"micro_batch_size": micro, "accumulation_steps": accum, "precision": precision,
               "gradient_checkpointing": ckpt, "optimizer": name, "lines": lines, "peak_bytes": lines["total"],
               "need_bytes": need_bytes(lines), "fits": need_bytes(lines) <= self.budget, "method": cal.method}
        if name in self.facts.step_seconds and cal.method == "measured":
            step = accum * cal.seconds_at(micro) + self.facts.step_seconds[name]
            fast, slow = cal.seconds_range_at(micro)
            one = self.facts.step_seconds[name]
            step_lo, step_hi = self.facts.step_range.get(name, (one, one))
            batch = self.cfg.train.batch_size
            row["samples_per_second"] = batch / step
            row["samples_per_second_range"] = [batch / (accum * slow + step_hi), batch / (accum * fast + step_lo)]
            if self.facts.vocab:
                row["tokens_per_second"] = row["samples_per_second"] * self.seq_len
                row["tokens_per_second_range"] = [v * self.seq_len for v in row["samples_per_second_range"]]
        return row


def run_plan(source: str | None, overrides: list[str], memory: str | None = None, nproc: int = 1,
             as_json: bool = False, search: bool = False, calibrate: bool | None = None) -> dict:
    """Prepare the data and build the model as ``leantrain train`` does, price this config's setting (estimated;
    measured where cheap with ``calibrate`` None, always with True, never with False) and with ``search`` every
    micro-batch x precision x checkpointing x optimizer, measured and timed; print and return the result."""
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
    choices = resolve_model_choices(cfg, data.task, device.type, precision)  # the attention and casts train uses
    model, trainable = apply_trainable(build_model(cfg.model, data.label_names, data.task,
                                                   attention=choices.attention), cfg.model, cfg.peft)
    model = model.to(device)  # LoRA (peft.*) and model.freeze as the run applies them
    ctx = PathsContext("plan", device, cfg.efficiency, choices, data.task.traits, strategy_name(cfg, nproc, quiet=True),
                       bool(cfg.report.sample_prompts), micro, cfg.data.block_size)
    paths = choose_paths(model, ctx)  # what train chooses; the weight casts and the output loss made as train does
    for line in paths.lines():
        log.info(line)
    facts = memory_model.model_facts(model, framework_bytes(model, cfg.report.plots))
    budget, budget_source = ((parse_bytes(memory), "--memory") if memory is not None else
                             default_budget(device, local=nproc) if device.type == "cpu" else default_budget(device))
    task = data.task.model.bind(model)  # as train binds it (live: its frozen copy, priced apart below)
    plan = Search(cfg, model, task, facts, longest_sequence(cfg, data), per_process, nproc,
                  strategy_name(cfg, nproc), budget)
    ckpt = cfg.efficiency.gradient_checkpointing
    result = {"device": str(device), "nproc": nproc, "strategy": plan.strategy, "seq_len": plan.seq_len,
              "global_batch": cfg.train.batch_size, "budget_bytes": budget, "budget_source": budget_source,
              "margin": MARGIN}
    if search:
        _calibrate_at(plan, precision, ckpt, micro)
        rows = [plan.option(*setting) for setting in _settings(plan, device)]
        result.update(plan.option(precision, ckpt, cfg.optim.name, micro))  # with its speed, now timed
        result.update(_recommendations(rows, (micro, precision, ckpt, cfg.optim.name), bool(facts.vocab)))
    else:
        row = plan.option(precision, ckpt, cfg.optim.name, micro)
        cost = estimate.pass_seconds(model, (2 + micro) * plan.seq_len, precision)  # passes at 1, 1 and micro
        what = f"real forward/backward passes ({'about ' + format_duration(cost) if cost else 'time unknown'} here)"
        if calibrate or (calibrate is None and cost is not None and cost <= CHEAP_SECONDS):
            log.info("%s: measuring with %s", "--calibrate" if calibrate else "cheap here", what)
            plan.calibration(precision, ckpt, size=micro)
            row = plan.option(precision, ckpt, cfg.optim.name, micro)
        elif _near_budget(row["lines"], budget):
            row["advice"] = f"the estimate is within {CLOSE:.0%} of the budget: --calibrate measures it with {what}"
        result.update(row)
        if not row["fits"]:
            result["fits_at"] = _largest_fitting(plan, precision, ckpt, cfg.optim.name)
    result["calibration"] = [c.__dict__ for c in [*plan.calibrations.values(), *plan.estimates.values()]]
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["trainable_parameters"] = trainable.trainable or result["parameters"]
    if trainable.method != "none" or trainable.frozen:
        result["peft"] = trainable.record(cfg.peft)
    result.update(data.task.report.plan(model, per_process, precision))  # preference: each reference's cost; GRPO: generation
    result["paths"] = paths.record()
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_plan(cfg, result)
    return result


def _near_budget(lines: dict[str, int], budget: int) -> bool:
    """Whether the fit could flip if the predicted training part (all but the measured framework overhead) were
    off by ``CLOSE`` either way."""
    def fits(scale: float) -> bool:
        base = lines["framework_overhead"]
        return need_bytes({**lines, "total": base + int((lines["total"] - base) * scale)}) <= budget

    return fits(1 - CLOSE) != fits(1 + CLOSE)


def _largest_fitting(plan: Search, precision: str, ckpt: bool, optimizer: str) -> dict | None:
    """The largest micro-batch that fits at the same settings (from what is already priced: nothing is run)."""
    for m in divisors_desc(plan.per_process):
        row = plan.option(precision, ckpt, optimizer, m)
        if row["fits"]:
            return {"micro_batch_size": m, "need_bytes": row["need_bytes"], "overrides": overrides_for(row)}
    return None


def _calibrate_at(search: Search, precision: str, ckpt: bool, micro: int) -> None:
    """The config's own setting measured at its micro-batch rather than extrapolated to it, when the extrapolation
    says it fits the budget: on a busy machine the time-sized calibration pass is small (1-2 examples), and the
    linear extrapolation from there is what misses (benchmarks/results/memory-planner.md); fit_micro_batch does
    the same for train.micro_batch_size=auto."""
    cal = search.calibration(precision, ckpt)
    if micro <= cal.sizes[1]:
        return
    lines = memory_model.lines(search.facts, cal, micro, search.state_bytes(search.cfg.optim.name),
                               strategy=search.strategy, nproc=search.nproc)
    if need_bytes(lines) <= search.budget:
        search.calibration(precision, ckpt, size=micro)
        log.info("calibrated again at micro-batch %d (the size this config runs)", micro)


def _settings(search: Search, device: torch.device) -> list[tuple[str, bool, str, int]]:
    """Every (precision, checkpointing, optimizer, micro-batch) the search prices, with what they need measured."""
    cfg = search.cfg
    can_ckpt = [False, True] if getattr(search.model, "supports_gradient_checkpointing", False) else [False]
    for p in precisions(device, cfg.efficiency.precision):
        for c in can_ckpt:
            search.calibration(p, c)
    memory_model.time_calibrations(search.model, list(search.calibrations.values()),  # interleaved timing rounds
                                   task=search.task)
    for name in {cfg.optim.name, *available_optimizers()}:
        search.measure_step(name)
    return [(p, c, name, m) for p in precisions(device, cfg.efficiency.precision) for c in can_ckpt
            for name in available_optimizers() for m in divisors_desc(search.per_process)]


def _changes(row: dict, current: tuple) -> int:
    """How many settings of ``row`` differ from the config's own (ties within noise go to the fewest changes)."""
    mine = (row["micro_batch_size"], row["precision"], row["gradient_checkpointing"], row["optimizer"])
    return sum(a != b for a, b in zip(mine, current))


def _recommendations(rows: list[dict], current: tuple, tokens: bool) -> dict:
    """The fitting settings ranked by predicted speed (a causal LM's in tokens/s), but only where the measured
    ranges separate them (``perf.noise.rank_by_speed``: 'within noise' otherwise, fewest changes first)."""
    key = speed_key(tokens)
    fits = rank_by_speed([r for r in rows if r["fits"]], key=key, prefer=lambda r: _changes(r, current))
    return {"recommendations": [{**r, "overrides": overrides_for(r)} for r in fits[:TOP]],
            "within_noise_of_fastest": sum(r["speed"] == "within noise" for r in fits),
            "options_considered": len(rows), "options_fitting": len(fits), "speed_unit": key,
            "options": [{"overrides": overrides_for(r), "need_bytes": r["need_bytes"], "fits": r["fits"],
                         **{k: r[k] for k in r if k.startswith(("samples_per", "tokens_per"))}} for r in rows]}


def speed_key(tokens: bool) -> str:
    """What the ranking compares: tokens/s for a causal LM (its samples are blocks), samples/s otherwise."""
    return "tokens_per_second" if tokens else "samples_per_second"


def overrides_for(row: dict) -> list[str]:
    return [f"train.micro_batch_size={row['micro_batch_size']}", f"efficiency.precision={row['precision']}",
            f"efficiency.gradient_checkpointing={str(row['gradient_checkpointing']).lower()}",
            f"optim.name={row['optimizer']}"]


def _print_stage(r: dict, w) -> None:
    """How the lines were priced, and what a deeper stage would add."""
    if r.get("method", "measured") == "estimated":
        w("  estimated: the model's forward/backward on fake tensors (no arithmetic; the CPU allocator's slack and "
          "the runtime's caches are not in it); --calibrate measures with real passes\n")
    if "advice" in r:
        w(f"  {r['advice']}\n")
    if "fits_at" in r:
        fit = r["fits_at"]
        w(f"  fits at micro-batch {fit['micro_batch_size']} ({format_bytes(fit['need_bytes'])}): "
          f"{fit['overrides'][0]}\n" if fit else "  no micro-batch fits at these settings: try --search\n")
    if "recommendations" not in r:
        w("  speed ranking of micro-batch x precision x checkpointing x optimizer: --search (real passes, timed)\n")


def print_plan(cfg: Config, r: dict, out=None) -> None:
    w = (out or sys.stdout).write  # read when called: a default bound at import would keep a replaced stdout
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
    _print_stage(r, w)
    _print_paths(r.get("paths") or {}, w)
    if "reference_choices" in r:
        _print_reference(r["reference_choices"], w)
    if "grpo_generation" in r:
        _print_generation(r["grpo_generation"], r, w)
    if "distill_teacher" in r:
        _print_teacher(r["distill_teacher"], r, w)
    if "recommendations" not in r:
        return
    key = r.get("speed_unit", "samples_per_second")
    unit = key.split("_")[0] + "/s"
    w(f"\nfastest of {r['options_fitting']} fitting settings (of {r['options_considered']}; global batch "
      f"{r['global_batch']} kept; predicted {unit} with the range its timed passes spanned):\n")
    for i, rec in enumerate(r["recommendations"], 1):
        lo, hi = rec[f"{key}_range"]
        w(f"  {i}. {format_rate(rec[key]):>8} {unit} ({format_rate(lo)}-{format_rate(hi)})  {rec['speed']:<12}  peak "
          f"{format_bytes(rec['peak_bytes']):>11}   {' '.join(rec['overrides'])}\n")
    if not r["recommendations"]:
        w("  none fits: lower data.max_length or train.batch_size, or raise --memory\n")
    elif r["recommendations"][0]["speed"] == "within noise":
        w(f"  within noise: {r['within_noise_of_fastest']} fitting setting(s) have predicted ranges that overlap the "
          "top one's, so their order is not measured: none of them is shown to be the fastest (choose among them by "
          "memory; listed from the fewest changes to your settings; a quieter machine narrows the ranges)\n")


def _print_paths(paths: dict, w) -> None:
    """The fast paths train chooses for this config (the connector's record), one row each: name, value, why."""
    if not paths:
        return
    w("  fast paths (as train chooses them):\n")
    for name, c in paths.items():
        value = ("on" if c["value"] else "off") if isinstance(c["value"], bool) else c["value"]
        w(f"    {name:<24} {str(value):<14} {c['reason']}\n")


def _print_generation(g: dict, r: dict, w) -> None:
    """GRPO's generation between the optimizer steps (no gradients, no activations held): the KV cache of its rows,
    the fused decode step's weight copies and the logits, beside the weights and the optimizer state."""
    lines = r["lines"]
    held = sum(lines.get(k, 0) for k in ("framework_overhead", "parameters", "optimizer_state"))
    peak = held + g["kv_cache_bytes"] + g["decode_copies_bytes"] + g["logits_bytes"]
    w(f"  generation (between steps: weights and optimizer state held, no gradients): {g['rows']} rows x "
      f"{g['positions']} positions\n")
    for label, key in (("KV cache", "kv_cache_bytes"), ("decode step's weight copies", "decode_copies_bytes"),
                       ("logits", "logits_bytes")):
        w(f"    {label:<28} {g[key]:>15,} B  {format_bytes(g[key]):>11}\n")
    where = "below" if peak <= lines["total"] else "ABOVE"
    w(f"    {'generation peak':<28} {peak:>15,} B  {format_bytes(peak):>11}  ({where} the training peak)\n")


def _print_teacher(t: dict, r: dict, w) -> None:
    """Distillation's teacher, held beside the student for the whole run (frozen, in the compute dtype), the states it
    leaves per step and the KV cache of the student's sampling; the training peak with them."""
    w(f"  teacher {t['teacher']} ({t['parameters'] / 1e6:.1f}M parameters, frozen), added to the above:\n")
    for label, key in (("weights", "weights_bytes"), ("its states of a step", "states_bytes"),
                       ("KV cache of the sampling", "kv_cache_bytes")):
        w(f"    {label:<28} {t[key]:>15,} B  {format_bytes(t[key]):>11}\n")
    peak = r["lines"]["total"] + t["weights_bytes"] + t["states_bytes"]
    w(f"    {'training peak with it':<28} {peak:>15,} B  {format_bytes(peak):>11}\n")


def _print_reference(pref: dict, w) -> None:
    """The preference task's reference choices (preference.reference), the run's marked."""
    w(f"  reference (preference.loss={pref['loss']}, preference.reference={pref['reference']}), added to the above:\n")
    for name, o in pref["reference_options"].items():
        mark = "*" if name == pref["reference"] else " "
        usable = "" if o["fits_this_run"] else " (not for this run)"
        w(f"   {mark} {name:<11} +{format_bytes(o['extra_bytes']):>10}  {o['cost']}{usable}\n")
