"""Checkpoints that survive a kill at any moment: atomic, durable, checksummed, pickle-free.

``output_dir/checkpoints/step-0000200/`` holds

- ``model.safetensors``                      the unwrapped model's state
- ``optimizer.safetensors`` + ``.json``      optimizer tensors / structure and hyper-parameters
- ``scheduler.json`` (+ ``scaler.json``)     LR schedule (and grad scaler) state
- ``trainer_state.json``                     step, epoch, position in the epoch, world size, batch, data fingerprint
- ``config.json``                            the resolved config
- ``rank-<r>.safetensors`` + ``.json``       per process: every RNG (python, numpy, torch CPU, CUDA), running loss
- ``manifest.json``                          sha256 of every file above: written last, it marks the checkpoint complete

Protocol: every rank writes its own files into ``checkpoints/.tmp-step-XXXXXXX/`` and fsyncs them; after a barrier
rank 0 writes the manifest, fsyncs the folder, renames it to ``step-XXXXXXX`` and fsyncs ``checkpoints/``; only then
are checkpoints beyond ``checkpoint.keep`` deleted. A folder without a manifest, or whose checksums do not match, is
never resumed from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import torch

from leantrain.engine.state_io import fsync_file, save_state

log = logging.getLogger("leantrain")

FORMAT = 1
ROOT = "checkpoints"
NAME = re.compile(r"^step-(\d{7,})$")
SHARED_FILES = ("model.safetensors", "optimizer.safetensors", "optimizer.json", "scheduler.json",
                "trainer_state.json", "config.json")

# Test hooks (deterministic stand-ins for a machine dying): read once per call, cost nothing when unset.
KILL_AT_STEP = "LEANTRAIN_TEST_KILL_AT_STEP"  # SIGKILL this process right after step k (and its save, if any)
CRASH_IN_SAVE = "LEANTRAIN_TEST_CRASH_IN_SAVE"  # die half-way through the save at step k (files written, no manifest)


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def rank_file(rank: int) -> str:
    return f"rank-{rank}"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_checkpoints(out: Path) -> list[Path]:
    """Folders named step-XXXXXXX that hold a manifest, newest first (checksums are checked when loading)."""
    root = Path(out) / ROOT
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and NAME.match(p.name) and (p / "manifest.json").is_file()]
    return sorted(found, key=lambda p: int(NAME.match(p.name).group(1)), reverse=True)


def verify(folder: Path) -> dict:
    """The manifest, after checking that every file it names is there with the recorded sha256.
    Raises ValueError naming the first problem."""
    mpath = folder / "manifest.json"
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{folder}: no valid manifest.json ({e}); the checkpoint is incomplete") from None
    for name, digest in files.items():
        path = folder / name
        if not path.is_file():
            raise ValueError(f"{folder}: {name} is missing")
        if sha256(path) != digest:
            raise ValueError(f"{folder}: {name} does not match its checksum in manifest.json (corrupt or replaced)")
    return manifest


def rng_state() -> dict:
    """Every random number generator this process uses, as tensors and lists of ints (no pickle)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if hasattr(torch, "mps") and torch.backends.mps.is_available():
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(tuple(tuple(v) if isinstance(v, list) else v for v in state["python"]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "mps" in state and hasattr(torch, "mps") and torch.backends.mps.is_available():
        torch.mps.set_rng_state(state["mps"])


def data_fingerprint(dataset) -> str:
    """sha256 over the processed training set's token ids, lengths and labels (cheap: Arrow buffers, no Python rows)."""
    import pyarrow.compute as pc

    h = hashlib.sha256()
    h.update(str(len(dataset)).encode())
    table = dataset.with_format("arrow")[:]  # the rows the dataset really holds (a hold-out is a selection)
    for col in ("input_ids", "length", "labels"):
        if col not in table.column_names:
            continue
        arr = table.column(col)
        if col == "input_ids":
            arr = pc.list_flatten(arr)
        h.update(col.encode())
        h.update(np.ascontiguousarray(arr.to_numpy(zero_copy_only=False).astype(np.int64)).tobytes())
    return h.hexdigest()


class Checkpointer:
    """Saves checkpoints of the run every ``checkpoint.every_steps`` optimizer steps; keeps the newest ``keep``."""

    def __init__(self, cfg, accelerator, out: Path, plan, fingerprint: str):
        self.cfg, self.accelerator, self.plan, self.fingerprint = cfg, accelerator, plan, fingerprint
        self.root = Path(out) / ROOT
        self.every = cfg.checkpoint.every_steps
        self.keep = cfg.checkpoint.keep
        self.last: Path | None = None

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0 and step < self.plan.total_steps

    def save(self, step: int, model, optimizer, scheduler, *, epoch: int, running, running_count: int,
             extra: dict) -> Path:
        """A collective: every rank calls it at the same step."""
        acc = self.accelerator
        final = self.root / checkpoint_name(step)
        tmp = self.root / f".tmp-{final.name}"
        if acc.is_main_process:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        save_state({"rng": rng_state(), "running_loss": running, "running_count": running_count},
                   tmp, rank_file(acc.process_index))
        if acc.is_main_process:
            self._save_shared(tmp, step, model, optimizer, scheduler, epoch, extra)
        acc.wait_for_everyone()
        if acc.is_main_process:
            _crash_hook(step)
            self._commit(tmp, final, step)
            self._prune()
        acc.wait_for_everyone()
        self.last = final
        return final

    def save_diagnostic(self, step: int, model, optimizer, scheduler) -> Path | None:
        """The last finite state (after optimizer step ``step``) once a later step went non-finite: model, optimizer
        and scheduler state in output_dir/nonfinite-state/. For inspection, not for resuming (the RNG and the data
        position have moved on; resume from the newest periodic checkpoint instead). Main process only."""
        if not self.accelerator.is_main_process:
            return None
        folder = self.root.parent / "nonfinite-state"
        tmp = folder.with_name(".tmp-nonfinite-state")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._save_shared(tmp, step, model, optimizer, scheduler, step // self.plan.steps_per_epoch,
                          {"diagnostic": "last finite state before a non-finite step"})
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        return folder

    def _save_shared(self, tmp: Path, step: int, model, optimizer, scheduler, epoch: int, extra: dict) -> None:
        from safetensors.torch import save_model

        acc = self.accelerator
        save_model(acc.unwrap_model(model), str(tmp / "model.safetensors"))
        fsync_file(tmp / "model.safetensors")
        save_state(optimizer.state_dict(), tmp, "optimizer")
        save_state(scheduler.state_dict(), tmp, "scheduler")
        if getattr(acc, "scaler", None) is not None:
            save_state(acc.scaler.state_dict(), tmp, "scaler")
        plan = self.plan
        trainer = {
            "format": FORMAT, "step": step, "epoch": epoch, "step_in_epoch": step - epoch * plan.steps_per_epoch,
            "steps_per_epoch": plan.steps_per_epoch, "total_steps": plan.total_steps,
            "world_size": acc.num_processes, "global_batch": plan.batch_size, "micro_batch": plan.micro_batch_size,
            "accumulation": plan.accum, "data_fingerprint": self.fingerprint, **extra,
        }
        save_state(trainer, tmp, "trainer_state")
        save_state(self.cfg.to_dict(), tmp, "config")

    def _commit(self, tmp: Path, final: Path, step: int) -> None:
        files = sorted(p.name for p in tmp.iterdir() if p.is_file())
        manifest = {"format": FORMAT, "step": step, "world_size": self.accelerator.num_processes,
                    "files": {name: sha256(tmp / name) for name in files}}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        fsync_file(tmp / "manifest.json")
        fsync_dir(tmp)
        if final.exists():  # the same step saved again (a resumed run): move the old one aside first
            old = self.root / f".old-{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(self.root)
        log.info("checkpoint: %s", final)

    def finish(self) -> dict:
        """After a successful run: keep the newest ``checkpoint.keep_final`` checkpoints, remove the rest (main
        process), log what was removed and return ``{"kept", "removed", "removed_bytes"}`` for summary.json."""
        found = complete_checkpoints(self.root.parent)
        keep = self.cfg.checkpoint.keep_final
        removed, freed = [], 0
        if self.accelerator.is_main_process:
            for old in found[keep:]:
                size = sum(f.stat().st_size for f in old.rglob("*") if f.is_file())
                shutil.rmtree(old, ignore_errors=True)
                removed.append(old.name)
                freed += size
            if removed:
                log.info("finished: removed %d checkpoint(s) (%s, %.1f MB; checkpoint.keep_final=%d), kept %s",
                         len(removed), ", ".join(removed), freed / 1e6, keep,
                         ", ".join(p.name for p in found[:keep]) or "none")
        self.accelerator.wait_for_everyone()
        return {"kept": [p.name for p in found[:keep]], "removed": removed, "removed_bytes": freed}

    def _prune(self) -> None:
        for old in complete_checkpoints(self.root.parent)[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in [*self.root.glob(".tmp-*"), *self.root.glob(".old-*")]:  # left by a run killed mid-save
            shutil.rmtree(stale, ignore_errors=True)


def _crash_hook(step: int) -> None:
    if os.environ.get(CRASH_IN_SAVE) == str(step):
        os._exit(137)


def kill_hook(step: int) -> None:
    """``LEANTRAIN_TEST_KILL_AT_STEP=k``: SIGKILL this process after step k, as a dying machine would."""
    if os.environ.get(KILL_AT_STEP) == str(step):
        os.kill(os.getpid(), signal.SIGKILL)
