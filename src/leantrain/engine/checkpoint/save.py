"""Checkpoints that survive a kill at any moment: atomic, durable, checksummed, pickle-free.

``output_dir/checkpoints/step-0000200/`` holds

- ``model.safetensors``                      the unwrapped model's state (LoRA / QLoRA: the trainable tensors and
                                             saved buffers only, with the frozen base's identity in its metadata)
- ``optimizer.safetensors`` + ``.json``      optimizer tensors / structure and hyper-parameters
- ``scheduler.json`` (+ ``scaler.json``)     LR schedule (and grad scaler) state
- ``trainer_state.json``                     step, epoch, position in the epoch, world size, batch, data fingerprint
- ``config.json``                            the resolved config
- ``rank-<r>.safetensors`` + ``.json``       per process: every RNG (python, numpy, torch CPU, CUDA), running loss
- ``manifest.json``                          sha256 of every file above: written last, it marks the checkpoint complete

Protocol: every rank writes its own files into ``checkpoints/.tmp-step-XXXXXXX/`` and fsyncs them; after a barrier
rank 0 writes the manifest, fsyncs the folder, renames it to ``step-XXXXXXX`` and fsyncs ``checkpoints/``; only then
are checkpoints beyond ``checkpoint.keep`` deleted (renamed to ``.del-step-XXXXXXX`` first, so that a prune killed
half-way never leaves a half-deleted step folder). A folder without a manifest, or whose checksums do not match, is
never resumed from (and is reported). A full disk during a save removes the partial folder and exits 2.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from leantrain.config import Config
from leantrain.engine.devices.batch_layout import BatchLayout
from leantrain.engine.training.faults import FaultInjector
from leantrain.engine.checkpoint.state_io import fsync_file, save_state
from leantrain.files import disk_full, disk_of, fsync_dir, sha256_file
from leantrain.errors import UserError
from leantrain.modeling.trainable_state import identity, saves_trainable_only, trainable_state

log = logging.getLogger("leantrain")

FORMAT = 1
ROOT = "checkpoints"
NAME = re.compile(r"^step-(\d{7,})$")
SHARED_FILES = ("model.safetensors", "optimizer.safetensors", "optimizer.json", "scheduler.json",
                "trainer_state.json", "config.json")

# Test hooks (deterministic stand-ins for a machine dying): read once per call, cost nothing when unset.


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def rank_file(rank: int) -> str:
    return f"rank-{rank}"


def complete_checkpoints(out: Path) -> list[Path]:
    """Folders named step-XXXXXXX that hold a manifest, newest first (checksums are checked when loading)."""
    root = Path(out) / ROOT
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and NAME.match(p.name) and (p / "manifest.json").is_file()]
    return sorted(found, key=lambda p: int(NAME.match(p.name).group(1)), reverse=True)


def checkpoint_folders(out: Path) -> list[Path]:
    """Every folder named step-XXXXXXX, newest first, with or without a manifest (a committed checkpoint always has
    one: a step folder without it was damaged, and ``verify`` says so)."""
    root = Path(out) / ROOT
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and NAME.match(p.name)]
    return sorted(found, key=lambda p: int(NAME.match(p.name).group(1)), reverse=True)


def clean_leftovers(root: Path) -> None:
    """What a run killed mid-save or mid-prune left in ``checkpoints/``: a step moved aside to be replaced
    (``.old-``) goes back when its replacement never arrived; unfinished saves (``.tmp-``) and prunes (``.del-``)
    are deleted."""
    if not root.is_dir():
        return
    for old in root.glob(".old-step-*"):
        final = root / old.name[len(".old-"):]
        if not final.exists() and (old / "manifest.json").is_file():
            os.replace(old, final)
    for stale in [*root.glob(".tmp-*"), *root.glob(".old-*"), *root.glob(".del-*")]:
        shutil.rmtree(stale, ignore_errors=True)


def verify(folder: Path) -> dict:
    """The manifest, after checking that every file it names is there with the recorded sha256.
    Raises ValueError naming the first problem."""
    mpath = folder / "manifest.json"
    if not mpath.exists():
        raise ValueError(f"{folder}: manifest.json is missing (deleted, or the folder was not written by a complete "
                         "save): its files cannot be verified")
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{folder}: no valid manifest.json ({e}); the checkpoint is incomplete") from None
    for name, digest in files.items():
        path = folder / name
        if not path.is_file():
            raise ValueError(f"{folder}: {name} is missing")
        if sha256_file(path) != digest:
            raise ValueError(f"{folder}: {name} does not match its checksum in manifest.json (corrupt or replaced)")
    return manifest


def data_fingerprint(dataset, columns: tuple[str, ...] | None = None) -> str:
    """sha256 over the content of every column of a processed dataset (``columns``: only those), so that a resume, a
    cache hit or an evaluation depends on the rows' values, not their count and lengths: pairs' chosen / rejected
    tokens and labels, feedback's ``desirable``, precomputed values. Cheap: Arrow buffers, no Python rows (text
    columns as their bytes); each column's name, type, row boundaries (list offsets) and values."""
    own = getattr(dataset, "data_fingerprint", None)
    if callable(own):  # not Arrow (token blocks over shards): the dataset names its own content
        return own()
    h = hashlib.sha256()
    h.update(str(len(dataset)).encode())
    table = dataset.with_format("arrow")[:]  # the rows the dataset really holds (a hold-out is a selection)
    for col in columns if columns is not None else table.column_names:
        if col in table.column_names:
            h.update(f"{col}:{table.column(col).type}".encode())
            _hash_array(h, table.column(col).combine_chunks())
    return h.hexdigest()


def _hash_array(h, arr) -> None:  # noqa: ANN001 - hashlib object, pyarrow Array
    """The values of ``arr`` into ``h``: list columns as their row lengths then their flattened values (recursively),
    strings as their lengths and UTF-8 bytes, numbers and booleans as their values; nulls as a validity mask."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if arr.null_count:
        h.update(np.asarray(arr.is_null()).tobytes())
    if pa.types.is_null(arr.type):  # all null: the mask says it all (its values as numpy are object pointers)
        return
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        h.update(np.asarray(pc.fill_null(pc.list_value_length(arr), 0), dtype=np.int64).tobytes())
        _hash_array(h, pc.list_flatten(arr))
    elif pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) or pa.types.is_binary(arr.type):
        data = pc.fill_null(arr, "").cast(pa.large_binary())
        h.update(np.asarray(pc.binary_length(data), dtype=np.int64).tobytes())
        h.update(b"".join(data.to_pylist()))
    elif pa.types.is_struct(arr.type):
        for i in range(arr.type.num_fields):
            h.update(arr.type.field(i).name.encode())
            _hash_array(h, arr.field(i))
    elif pa.types.is_fixed_size_list(arr.type):
        _hash_array(h, arr.flatten())
    else:
        try:
            h.update(np.ascontiguousarray(arr.to_numpy(zero_copy_only=False)).tobytes())
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, TypeError):  # another Arrow type: its values as text
            h.update(repr(arr.to_pylist()).encode())


class Checkpointer:
    """Saves checkpoints of the run every ``checkpoint.every_steps`` optimizer steps; keeps the newest ``keep``."""

    def __init__(self, cfg: Config, accelerator: Accelerator, out: Path, layout: BatchLayout, fingerprint: str,
                 faults: FaultInjector | None = None):
        self.cfg, self.accelerator, self.layout, self.fingerprint = cfg, accelerator, layout, fingerprint
        self.faults = faults
        self.root = Path(out) / ROOT
        self.every = cfg.checkpoint.every_steps
        self.keep = cfg.checkpoint.keep
        self.last: Path | None = None

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0 and step < self.layout.total_steps

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler, state: dict) -> Path:
        """The loop's state (``LoopState.state_dict()``: ``trainer``, shared, and ``rank``, this process's) with the
        model, optimizer and schedule at its step. A collective: every rank calls it at the same step."""
        acc = self.accelerator
        step = state["trainer"]["step"]
        final = self.root / checkpoint_name(step)
        tmp = self.root / f".tmp-{final.name}"
        try:
            if acc.is_main_process:
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir(parents=True)
            acc.wait_for_everyone()
            save_state(state["rank"], tmp, rank_file(acc.process_index))
            if acc.is_main_process:
                self._save_shared(tmp, model, optimizer, scheduler, state["trainer"])
            acc.wait_for_everyone()
            if acc.is_main_process:
                if self.faults is not None:
                    self.faults.in_save(step)
                self._commit(tmp, final, step)
        except Exception as e:
            if not disk_full(e):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            previous = complete_checkpoints(self.root.parent)
            intact = (f"the previous checkpoint (step {int(NAME.match(previous[0].name).group(1))}) is intact"
                      if previous else "there is no earlier checkpoint")
            raise UserError(f"disk full while saving checkpoint step {step} to {final}; {intact}; free some space on "
                            f"{disk_of(self.root)} and run the same command again to resume (a new checkpoint is "
                            "written in full before an older one is deleted, so it needs room for one more whatever "
                            "checkpoint.keep is)") from None
        if acc.is_main_process:
            self._prune()
        acc.wait_for_everyone()
        self.last = final
        return final

    def save_diagnostic(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                        scheduler: LRScheduler) -> Path | None:
        """The last finite state (after optimizer step ``step``) once a later step went non-finite: model, optimizer
        and scheduler state in output_dir/nonfinite-state/. For inspection, not for resuming (the RNG and the data
        position have moved on; resume from the newest periodic checkpoint instead). Main process only."""
        if not self.accelerator.is_main_process:
            return None
        folder = self.root.parent / "nonfinite-state"
        tmp = folder.with_name(".tmp-nonfinite-state")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._save_shared(tmp, model, optimizer, scheduler, {"step": step, "epoch": step // self.layout.steps_per_epoch,
                                                             "diagnostic": "last finite state before a non-finite step"})
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        return folder

    def _save_shared(self, tmp: Path, model, optimizer, scheduler, counters: dict) -> None:
        """What rank 0 alone writes: the model, optimizer, schedule, config and ``trainer_state`` (the layout and
        data the run had, with ``counters``: at least step and epoch)."""
        from safetensors.torch import save_model

        acc = self.accelerator
        inner = acc.unwrap_model(model)
        if saves_trainable_only(inner):  # LoRA / QLoRA: the frozen base is rebuilt on resume, its identity kept
            from safetensors.torch import save_file

            base = self.cfg.model.name or f"a {self.cfg.model.config_type or 'configured'} model from its config"
            save_file(trainable_state(inner), str(tmp / "model.safetensors"), metadata=identity(inner, base))
        else:
            save_model(inner, str(tmp / "model.safetensors"))
        fsync_file(tmp / "model.safetensors")
        save_state(optimizer.state_dict(), tmp, "optimizer")
        save_state(scheduler.state_dict(), tmp, "scheduler")
        if getattr(acc, "scaler", None) is not None:
            save_state(acc.scaler.state_dict(), tmp, "scaler")
        layout, step, epoch = self.layout, counters["step"], counters["epoch"]
        trainer = {
            "format": FORMAT, "step": step, "epoch": epoch, "step_in_epoch": step - epoch * layout.steps_per_epoch,
            "steps_per_epoch": layout.steps_per_epoch, "total_steps": layout.total_steps,
            "world_size": acc.num_processes, "global_batch": layout.batch_size, "micro_batch": layout.micro_batch_size,
            "accumulation": layout.accum, "data_fingerprint": self.fingerprint, **counters,
        }
        save_state(trainer, tmp, "trainer_state")
        save_state(self.cfg.to_dict(), tmp, "config")

    def _commit(self, tmp: Path, final: Path, step: int) -> None:
        files = sorted(p.name for p in tmp.iterdir() if p.is_file())
        manifest = {"format": FORMAT, "step": step, "world_size": self.accelerator.num_processes,
                    "files": {name: sha256_file(tmp / name) for name in files}}
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
                freed += sum(f.stat().st_size for f in old.rglob("*") if f.is_file())
                self._remove(old)
                removed.append(old.name)
            if removed:
                log.info("finished: removed %d checkpoint(s) (%s, %.1f MB; checkpoint.keep_final=%d), kept %s",
                         len(removed), ", ".join(removed), freed / 1e6, keep,
                         ", ".join(p.name for p in found[:keep]) or "none")
        self.accelerator.wait_for_everyone()
        return {"kept": [p.name for p in found[:keep]], "removed": removed, "removed_bytes": freed}

    def _prune(self) -> None:
        """Rename first, delete after: a prune killed half-way leaves a ``.del-`` folder (cleaned at the next start
        or save), never a half-deleted ``step-`` folder."""
        for old in complete_checkpoints(self.root.parent)[self.keep:]:
            self._remove(old)
        fsync_dir(self.root)
        clean_leftovers(self.root)

    def _remove(self, old: Path) -> None:
        """Renamed to ``.del-<name>`` first (a kill here leaves no half-deleted ``step-`` folder), then deleted."""
        doomed = self.root / f".del-{old.name}"
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
