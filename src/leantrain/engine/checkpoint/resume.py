"""Where a run starts: afresh, from a checkpoint (exactly, or refused), or not at all (already complete).

``checkpoint.resume=auto`` resumes from the newest complete checkpoint in output_dir whose resolved config equals
this one, ignoring keys that cannot change the computation (HARMLESS). Any other difference exits 2 naming the keys.
Changes that make a resume inexact (world size, global batch, data, a missing RNG state) are refused unless
``checkpoint.allow_inexact_resume=true``, which turns them into a warning that says what will differ.

The newest checkpoint that verifies wins, compared with its own config: a finished run's summary.json counts only
when the checkpoints are that run's (a later ``checkpoint.resume=never`` run, interrupted, is resumed, not mistaken
for the finished one). A step folder whose manifest is missing or damaged is reported, never skipped silently.
No message proposes a command that deletes checkpoints.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from leantrain.config import Config
from leantrain.engine.devices.batch_layout import BatchLayout
from leantrain.engine.checkpoint.save import ROOT, checkpoint_folders, clean_leftovers, rank_file, verify
from leantrain.engine.checkpoint.state_io import StateFormatError, load_safetensors, load_state
from leantrain.engine.training.loop_state import LoopState
from leantrain.errors import UserError
from leantrain.modeling.trainable_state import CHECKPOINT_KIND, base_fingerprint, load_trainable_state
from leantrain.report.logs import read_metrics

log = logging.getLogger("leantrain")

# config keys (or prefixes ending in '.') that cannot change what is computed
HARMLESS = ("output_dir", "report.", "efficiency.cpu_allocator", "efficiency.recast_weights", "train.log_every_steps", "train.eval_every_steps", "train.eval_batch_size",
            "train.warmup_steps_excluded", "checkpoint.every_steps", "checkpoint.keep", "checkpoint.resume",
            "checkpoint.allow_inexact_resume", "checkpoint.keep_final", "data.num_workers", "data.cache_dir")
# config keys whose change makes a resume inexact: allowed only with checkpoint.allow_inexact_resume
INEXACT = {"train.batch_size": "the data position is a step index: the examples after the resume point differ",
           "train.micro_batch_size": "the float summation order of each step differs"}
# (key, value in an older checkpoint, value now) pairs that compute the same: a default renamed to auto, where auto
# resolves to the old value (efficiency.compile: engine.efficiency.choose_compile keeps it off on every device today)
SAME = {("efficiency.compile", "false", '"auto"')}


@dataclass
class Decision:
    kind: str  # fresh | resume | complete
    path: Path | None = None
    summary: dict | None = None
    inexact: list[str] = field(default_factory=list)


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(old: dict, new: dict) -> tuple[list[str], list[str]]:
    """(blocking differences, inexact differences) as 'key: old -> new' lines; harmless keys are ignored."""
    a, b = _flat(old), _flat(new)
    defaults = _flat(Config().to_dict())
    blocking, inexact = [], []
    for key in sorted(set(a) | set(b)):
        if any(key == h or (h.endswith(".") and key.startswith(h)) for h in HARMLESS):
            continue
        if key not in a and key in defaults and json.dumps(b.get(key)) == json.dumps(defaults[key]):
            continue  # a key added to leantrain since the checkpoint was written, at its default: nothing changed
        if (key, json.dumps(a.get(key)), json.dumps(b.get(key))) in SAME:
            continue
        if a.get(key) != b.get(key) and json.dumps(a.get(key)) != json.dumps(b.get(key)):
            line = f"{key}: {a.get(key)!r} -> {b.get(key)!r}"
            (inexact if key in INEXACT else blocking).append(line + (f" ({INEXACT[key]})" if key in INEXACT else ""))
    return blocking, inexact


def _differs_error(where: Path, blocking: list[str]) -> UserError:
    return UserError(
        f"{where} was written with a different config; change these back to continue that run, or pass another "
        "output_dir for a new one (nothing in this folder is changed):", blocking)


def decide_here(cfg: Config, out: Path) -> Decision:
    """The decision of this process alone, from the files in ``out`` (fresh, resume or complete); see ``decide``."""
    mode = cfg.checkpoint.resume
    now = cfg.to_dict()
    clean_leftovers(out / ROOT)  # of a run killed mid-save or mid-prune
    if mode == "never":
        if (out / ROOT).is_dir():
            log.info("checkpoint.resume=never: removing the old checkpoints in %s", out / ROOT)
            shutil.rmtree(out / ROOT)
        if (out / "summary.json").is_file():  # the folder no longer holds a finished run until this one finishes
            (out / "summary.json").unlink()
        return Decision("fresh")
    if mode != "auto":
        path = Path(mode)
        if not path.is_dir():
            raise UserError(f"checkpoint.resume={mode}: no such checkpoint folder")
        try:
            verify(path)
        except ValueError as e:
            raise UserError(f"checkpoint.resume={mode}: {e}") from None
        return _with_config(path, now)
    newest, bad = _newest_verified(out)
    finished = (out / "summary.json").is_file() and (out / "config.yaml").is_file()
    if finished:
        finished_cfg = yaml.safe_load((out / "config.yaml").read_text())
        if newest is not None and any(config_diff(_checkpoint_config(newest), finished_cfg)):
            finished = False  # the checkpoint is from a later run here (checkpoint.resume=never): follow it
    if finished:
        blocking, inexact = config_diff(finished_cfg, now)
        if blocking or inexact:
            raise _differs_error(out, blocking + inexact)
        return Decision("complete", summary=json.loads((out / "summary.json").read_text()))
    if newest is not None:
        return _with_config(newest, now)
    if bad:
        raise UserError(f"no checkpoint in {out / ROOT} verifies; move them aside to keep them and start afresh, or "
                        "pass another output_dir:", bad)
    return Decision("fresh")


def _newest_verified(out: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint whose manifest and checksums verify, and what is wrong with the newer ones (a folder
    whose manifest.json is missing or damaged is reported like a checksum failure, never skipped silently)."""
    bad = []
    for path in checkpoint_folders(out):
        try:
            verify(path)
        except ValueError as e:
            log.warning("warning: skipping checkpoint %s", e)
            bad.append(str(e))
            continue
        return path, bad
    return None, bad


def _checkpoint_config(path: Path) -> dict:
    try:
        return load_state(path, "config")
    except StateFormatError as e:
        raise UserError(f"cannot resume from {path}: {e}") from None


def _with_config(path: Path, now: dict) -> Decision:
    old = _checkpoint_config(path)
    blocking, inexact = config_diff(old, now)
    if blocking:
        raise _differs_error(path, blocking)
    return Decision("resume", path=path, inexact=inexact)


def decide(cfg: Config, out: Path, accelerator: Accelerator) -> Decision:
    """Rank 0 decides (it alone may remove folders); every rank gets the same decision or the same error."""
    box: list = [None, None]
    if accelerator.is_main_process:
        try:
            box[0] = decide_here(cfg, out)
        except UserError as e:
            box[1] = (str(e.args[0]), e.problems)
    if accelerator.num_processes > 1:
        broadcast_object_list(box, from_process=0)
    if box[1] is not None:
        raise UserError(*box[1])
    decision = box[0]
    if decision.kind == "complete":
        log.info("the run in %s is already complete (summary.json, same config): nothing to do", out)
    return decision


def restore(decision: Decision, cfg: Config, accelerator: Accelerator, layout: BatchLayout, fingerprint: str,
            model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler) -> LoopState:
    """The loop's state: fresh, or a checkpoint's, loaded with its model, optimizer and scheduler into the prepared
    ones; refuses silent inexactness."""
    state = LoopState.fresh(accelerator.device)
    if decision.kind != "resume":
        return state
    path = decision.path
    try:
        trainer = load_state(path, "trainer_state")
        for p in resume_problems(decision, cfg, accelerator, layout, fingerprint):
            log.warning("warning: inexact resume: %s", p)
        _load_model(path, accelerator.unwrap_model(model))
        optimizer.load_state_dict(load_state(path, "optimizer"))
        scheduler.load_state_dict(load_state(path, "scheduler"))
        if getattr(accelerator, "scaler", None) is not None and (path / "scaler.json").is_file():
            accelerator.scaler.load_state_dict(load_state(path, "scaler"))
        mine = path / f"{rank_file(accelerator.process_index)}.json"
        rank = load_state(path, rank_file(accelerator.process_index)) if mine.is_file() else {}
    except StateFormatError as e:
        raise UserError(f"cannot resume from {path}: {e}") from None
    state.load_state_dict({"trainer": trainer, "rank": rank}, layout.steps_per_epoch, accelerator.device)
    state.resumed_from = path
    log.info("resuming from %s (step %d of %d)", path, state.step, layout.total_steps)
    return state


def resume_problems(decision: Decision, cfg: Config, accelerator: Accelerator, layout: BatchLayout,
                    fingerprint: str) -> list[str]:
    """What makes resuming ``decision`` inexact (changed data, world size, global batch, missing RNG state): exit 2
    unless ``checkpoint.allow_inexact_resume``, else the list to warn about. Needs no model: the run calls it before
    building one."""
    if decision.kind != "resume":
        return []
    path = decision.path
    try:
        trainer = load_state(path, "trainer_state")
    except StateFormatError as e:
        raise UserError(f"cannot resume from {path}: {e}") from None
    problems = _inexact(decision, trainer, accelerator, layout, fingerprint, path)
    if problems and not cfg.checkpoint.allow_inexact_resume:
        raise UserError(f"cannot resume exactly from {path}; pass checkpoint.allow_inexact_resume=true to resume "
                        "anyway:", problems)
    return problems


def _inexact(decision: Decision, trainer: dict, accelerator: Accelerator, layout: BatchLayout, fingerprint: str,
             path: Path) -> list[str]:
    problems = list(decision.inexact)
    world = accelerator.num_processes
    if trainer.get("world_size") != world:
        problems.append(f"world size {trainer.get('world_size')} -> {world}: each process's random stream "
                        "(dropout) and the float summation order differ")
    if trainer.get("global_batch") != layout.batch_size and not any(p.startswith("train.batch_size") for p in problems):
        problems.append(f"global batch {trainer.get('global_batch')} -> {layout.batch_size}: the examples after the "
                        "resume point differ")
    if trainer.get("data_fingerprint") != fingerprint:
        problems.append(f"the training data changed (fingerprint {str(trainer.get('data_fingerprint'))[:12]} -> "
                        f"{fingerprint[:12]}): the batches after the resume point differ from the run's")
    missing = [r for r in range(world) if not (path / f"{rank_file(r)}.json").is_file()]
    if missing:
        problems.append(f"no RNG / running-loss state for process(es) {missing}: they continue with fresh "
                        "random streams (dropout differs) and the first logged loss covers fewer steps")
    return problems


def _load_model(path: Path, model) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    file = path / "model.safetensors"
    try:
        meta = _metadata(file)
        if meta.get("leantrain") == CHECKPOINT_KIND:  # LoRA / QLoRA: the trainable state over the rebuilt base
            _check_base(meta, model, file)
            missing, unexpected = load_trainable_state(model, load_safetensors(file))
        else:
            missing, unexpected = load_model(model, str(file), strict=False)
    except (SafetensorError, OSError, ValueError) as e:
        raise StateFormatError(f"{file}: not a valid safetensors file ({e})") from None
    if missing or unexpected:
        raise StateFormatError(f"model.safetensors does not fit the model (missing {sorted(missing)[:5]}, "
                               f"unexpected {sorted(unexpected)[:5]})")


def _metadata(file: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        return f.metadata() or {}


def _check_base(meta: dict, model, file: Path) -> None:  # noqa: ANN001
    """A trainable-only checkpoint continues only over the base it was trained on."""
    saved = meta.get("base_fingerprint")
    if saved is not None and saved != base_fingerprint(model):
        raise StateFormatError(f"{file} holds an adapter trained over {meta.get('base', 'another base')}, whose "
                               "frozen weights differ from the base loaded now (its files changed since the "
                               "checkpoint); the run can only continue over the same base")


def prior_records(out: Path, state: LoopState) -> list[dict]:
    """A resumed run's metrics.jsonl: the records up to the resume step (a killed run may have logged past it)."""
    path = Path(out) / "metrics.jsonl"
    if state.resumed_from is None or not path.is_file():
        return []
    try:
        return [r for r in read_metrics(path) if r.get("step", 0) <= state.step]
    except ValueError:  # a line cut by the kill, or damage: the checkpoint, not the log, is the source of truth
        pass
    records, damaged = [], []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            damaged.append(number)
            continue
        if isinstance(record.get("step", 0), (int, float)) and record.get("step", 0) <= state.step:
            records.append(record)
    log.warning("warning: %s: skipping %d damaged line(s) (line %s); the log is rewritten from the rest, the "
                "checkpoint is the source of truth", path, len(damaged), ", ".join(map(str, damaged[:10])))
    return records
