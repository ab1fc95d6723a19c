"""`leantrain plan`: the predicted peak memory of a config on this device, line by line, and the fastest settings
that fit a budget (micro-batch x precision x gradient checkpointing x optimizer, keeping the global batch).

It prepares the data and builds the model exactly as ``leantrain train`` does (so the framework overhead is this
process's own, measured), then calibrates with a few short forward/backward passes (``leantrain.perf.planner``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import statistics
import sys

import torch

from leantrain.config import Config, resolve
from leantrain.perf import planner
from leantrain.perf.noise import rank_by_speed
from leantrain.perf.plan import (MARGIN, RUN_ALLOWANCE, default_budget, divisors_desc, framework_bytes,
                                 longest_sequence, need_bytes, parse_bytes)

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


def run_plan(source: str | None, overrides: list[str], memory: str | None = None, nproc: int = 1,
             as_json: bool = False, recommend: bool = True) -> dict:
    from leantrain.engine.distributed import strategy_name
    from leantrain.engine.efficiency import resolve_precision
    from leantrain.engine.inputs import prepare_inputs
    from leantrain.engine.setup import make_accelerator, setup_logging
    from leantrain.modeling import build_model

    cfg = resolve(source, overrides)
    if nproc < 1:
        from leantrain.errors import UserError
        raise UserError(f"--nproc must be at least 1 (got {nproc})")
    accelerator = make_accelerator(cfg, None, "no")
    setup_logging(True)
    device = accelerator.device
    precision = resolve_precision(cfg.efficiency.precision, device.type)[0]
    inputs = prepare_inputs(cfg, accelerator)
    per_process = cfg.train.batch_size // nproc
    if per_process < 1 or cfg.train.batch_size % nproc:
        from leantrain.errors import UserError
        raise UserError(f"train.batch_size={cfg.train.batch_size} does not divide over --nproc {nproc}")
    micro = cfg.train.micro_batch_size if isinstance(cfg.train.micro_batch_size, int) else per_process
    if per_process % micro:
        micro = max(d for d in divisors_desc(per_process) if d <= micro)
    seq_len = longest_sequence(cfg, inputs)
    model = build_model(cfg.model, inputs.label_names).to(device)
    facts = planner.model_facts(model, framework_bytes(model, cfg.report.plots))
    strategy = strategy_name(cfg, nproc)
    budget, source_text = ((parse_bytes(memory), "--memory") if memory is not None else
                           default_budget(device, local=nproc) if device.type == "cpu" else default_budget(device))

    cals: dict[tuple[str, bool], planner.Calibration] = {}

    def cal(p: str, ckpt: bool) -> planner.Calibration:
        if (p, ckpt) not in cals:
            cals[p, ckpt] = planner.calibrate(model, seq_len, p, ckpt, per_process, timing=False)
            log.info("calibrated: %s, gradient checkpointing %s, micro-batches %s x %d tokens", p,
                     "on" if ckpt else "off", cals[p, ckpt].sizes, seq_len)
            facts.warmup_bytes = max(facts.warmup_bytes, cals[p, ckpt].warmup_bytes)
        return cals[p, ckpt]

    def state(name: str) -> int:
        if name not in facts.state_bytes:
            facts.state_bytes[name] = planner.meta_state_bytes(model, cfg.optim.model_copy(update={"name": name}))
        return facts.state_bytes[name]

    def option(p: str, ckpt: bool, name: str, m: int) -> dict:
        c = cal(p, ckpt)
        lines = planner.lines(facts, c, m, state(name), strategy=strategy, nproc=nproc)
        row = {"micro_batch_size": m, "accumulation_steps": per_process // m, "precision": p,
               "gradient_checkpointing": ckpt, "optimizer": name, "lines": lines, "peak_bytes": lines["total"],
               "need_bytes": need_bytes(lines), "fits": need_bytes(lines) <= budget}
        if name in facts.step_seconds:
            accum = per_process // m
            step = accum * c.seconds_at(m) + facts.step_seconds[name]
            (fast, slow), (step_lo, step_hi) = c.seconds_range_at(m), facts.step_range.get(name, (None, None))
            step_lo = facts.step_seconds[name] if step_lo is None else step_lo
            step_hi = facts.step_seconds[name] if step_hi is None else step_hi
            row["samples_per_second"] = cfg.train.batch_size / step
            row["samples_per_second_range"] = [cfg.train.batch_size / (accum * slow + step_hi),
                                               cfg.train.batch_size / (accum * fast + step_lo)]
        return row

    ckpt = cfg.efficiency.gradient_checkpointing
    result = {"device": str(device), "nproc": nproc, "strategy": strategy, "seq_len": seq_len,
              "global_batch": cfg.train.batch_size, "budget_bytes": budget, "budget_source": source_text,
              "margin": MARGIN}
    cal(precision, ckpt)
    if recommend:
        can_ckpt = [False, True] if getattr(model, "supports_gradient_checkpointing", False) else [False]
        for p in precisions(device, cfg.efficiency.precision):
            for c in can_ckpt:
                cal(p, c)
        planner.time_calibrations(model, list(cals.values()))  # all settings in interleaved rounds
        for name in {cfg.optim.name, *available_optimizers()}:
            if name not in facts.step_seconds:
                times = planner.measure_step_times(model, cfg.optim.model_copy(update={"name": name}))
                facts.step_seconds[name] = statistics.median(times)
                facts.step_range[name] = (min(times), max(times))
    result.update(option(precision, ckpt, cfg.optim.name, micro))
    if recommend:
        rows = [option(p, c, name, m) for p in precisions(device, cfg.efficiency.precision) for c in can_ckpt
                for name in available_optimizers() for m in divisors_desc(per_process)]
        current = (micro, precision, ckpt, cfg.optim.name)
        changes = lambda r: sum(a != b for a, b in zip(  # noqa: E731 - settings that differ from the config's
            (r["micro_batch_size"], r["precision"], r["gradient_checkpointing"], r["optimizer"]), current))
        fits = rank_by_speed([r for r in rows if r["fits"]], prefer=changes)
        result["recommendations"] = [{**r, "overrides": overrides_for(r)} for r in fits[:TOP]]
        result["within_noise_of_fastest"] = sum(r["speed"] == "within noise" for r in fits)
        result["options_considered"], result["options_fitting"] = len(rows), len(fits)
        result["options"] = [{"overrides": overrides_for(r), "need_bytes": r["need_bytes"], "fits": r["fits"],
                               "samples_per_second": r["samples_per_second"],
                               "samples_per_second_range": r["samples_per_second_range"]} for r in rows]
    result["calibration"] = [c.__dict__ for c in cals.values()]
    result["parameters"] = sum(p.numel() for p in model.parameters())
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_plan(cfg, result)
    return result


def overrides_for(row: dict) -> list[str]:
    return [f"train.micro_batch_size={row['micro_batch_size']}", f"efficiency.precision={row['precision']}",
            f"efficiency.gradient_checkpointing={str(row['gradient_checkpointing']).lower()}",
            f"optim.name={row['optimizer']}"]


def human(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def print_plan(cfg: Config, r: dict, out=sys.stdout) -> None:
    w = out.write
    w(f"plan for {r['parameters'] / 1e6:.1f}M parameters on {r['device']} ({r['nproc']} process(es), strategy "
      f"{r['strategy']}): micro-batch {r['micro_batch_size']} x {r['accumulation_steps']} accumulation, "
      f"{r['seq_len']} tokens, {r['precision']}, gradient checkpointing {'on' if r['gradient_checkpointing'] else 'off'}"
      f", optimizer {r['optimizer']}\n")
    for k, v in r["lines"].items():
        label = "predicted peak (per process)" if k == "total" else k.replace("_", " ")
        w(f"  {label:<30} {v:>15,} B  {human(v):>11}\n")
    w(f"  budget {human(r['budget_bytes'])} ({r['budget_source']}): "
      f"{'fits' if r['fits'] else 'does NOT fit'} (with {MARGIN:.0%} margin on the training part and "
      f"{RUN_ALLOWANCE // 2**20} MiB for evaluation and saving: "
      f"{human(r['need_bytes'])})\n")
    if "recommendations" not in r:
        return
    w(f"\nfastest of {r['options_fitting']} fitting settings (of {r['options_considered']}; global batch "
      f"{r['global_batch']} kept; predicted samples/s with the range its timed passes spanned):\n")
    for i, rec in enumerate(r["recommendations"], 1):
        lo, hi = rec["samples_per_second_range"]
        w(f"  {i}. {rec['samples_per_second']:8.1f} samples/s ({lo:.1f}-{hi:.1f})  {rec['speed']:<12}  peak "
          f"{human(rec['peak_bytes']):>11}   {' '.join(rec['overrides'])}\n")
    if not r["recommendations"]:
        w("  none fits: lower data.max_length or train.batch_size, or raise --memory\n")
    elif r["recommendations"][0]["speed"] == "within noise":
        w(f"  within noise: {r['within_noise_of_fastest']} fitting setting(s) have predicted ranges that overlap the "
          "top one's, so their order is not measured: none of them is shown to be the fastest (choose among them by "
          "memory; listed from the fewest changes to your settings; a quieter machine narrows the ranges)\n")
