"""Per-row values a task computes once, before training, with the model as it starts (``Task.data.precomputed_columns``:
the preference task's reference log-probs under ``preference.reference=precompute``), cached on disk and added to the
processed datasets as columns, so that every batch carries them and training runs no reference forward.

The cache sits beside the run's processed data (the folder of the dataset's Arrow cache files, else the datasets
cache), one ``.npy`` file per (model, data, columns, arithmetic): the key is the sha256 of the model's class, config
and weights, the processed rows' content, the columns, the autocast precision and the paths the forward computes
them by (``compute_paths``: the output loss, the attention implementation), so another run on the same model and data
reads it, and anything that changes the values, to the last bit, misses it. The file is written to a temporary name and
renamed (a reader never sees half a file), with a record beside it (``<key>.json``: the sha256 of its bytes and its
dtype), and checked when read (those bytes, its dtype and shape, finite values); a file that fails the check is
computed again, with a warning saying why. The main process computes and writes; the others wait and read. The folder is recorded
with the caches, so ``leantrain cache --list`` / ``--clear`` show and remove it (``leantrain.data.caches``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator

from leantrain.data.caches import PRECOMPUTED, default_datasets_cache, record_cache_folder
from leantrain.data.loaders import eval_loader, to_device
from leantrain.engine.checkpoint.save import data_fingerprint
from leantrain.files import sha256_file, write_atomic
from leantrain.modeling.chunked_loss import KERNEL, chunked_layer
from leantrain.modeling.wrappers import unwrapped

log = logging.getLogger("leantrain")
FOLDER = PRECOMPUTED  # listed and cleared by leantrain cache --list / --clear


def model_fingerprint(model: torch.nn.Module) -> str:
    """sha256 of the model's class, config and every parameter and buffer (names, dtypes, bytes)."""
    h = hashlib.sha256(type(model).__name__.encode())
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_json_string"):
        h.update(config.to_json_string(use_diff=False).encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def compute_paths(model: torch.nn.Module) -> str:
    """The paths the model's forward computes its values by, beyond its weights: the output loss installed (chunked,
    Liger's, or the plain logits) and the attention implementation. Equal numbers to rounding, not to the bit: a run
    must not read values another path computed (a run's result would then depend on what ran before it)."""
    layer = chunked_layer(model)
    loss = getattr(layer, KERNEL, "installed") if layer is not None else "logits"
    attention = getattr(getattr(unwrapped(model), "config", None), "_attn_implementation", None)
    return f"output={loss}/attention={attention}"


def cache_file(dataset, key: str) -> Path:
    """Where the values of ``dataset`` under ``key`` are kept: beside its Arrow cache files, else in the datasets
    cache."""
    files = getattr(dataset, "cache_files", None) or []
    root = Path(files[0]["filename"]).parent if files else default_datasets_cache()
    return root / FOLDER / f"{key}.npy"


def read_values(path: Path, rows: int, width: int) -> tuple[np.ndarray | None, str | None]:
    """(the cached values, None), or (None, why not): missing, without its record, bytes other than the ones written
    (the sha256 and dtype recorded beside the file at write time), another shape, unreadable or not finite."""
    if not path.is_file():
        return None, None
    try:
        record = json.loads(record_of(path).read_text())
    except (OSError, ValueError):
        return None, f"{path.name} has no readable record {record_of(path).name} of its checksum"
    if record.get("sha256") != sha256_file(path) or record.get("dtype") != "float32":
        return None, f"{path.name} is not the file that was written (its sha256 differs from {record_of(path).name})"
    try:
        values = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None, f"{path.name} is not readable"
    if values.dtype != np.float32 or values.shape != (rows, width) or not np.isfinite(values).all():
        return None, f"{path.name} holds {values.dtype} {values.shape}, not finite float32 ({rows}, {width})"
    return values, None


def record_of(path: Path) -> Path:
    """The record beside a cached ``.npy``: the sha256 of its bytes and its dtype, written after it."""
    return path.with_suffix(".json")


def write_values(path: Path, values: np.ndarray) -> None:
    """Write atomically (temp file + rename), then its record (sha256 of the bytes, dtype), atomically too: a file
    without a matching record is never read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    values = np.ascontiguousarray(values, dtype=np.float32)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
    np.save(tmp, values, allow_pickle=False)
    digest = sha256_file(tmp)
    os.replace(tmp, path)
    write_atomic(record_of(path), json.dumps({"sha256": digest, "dtype": "float32", "shape": list(values.shape)}))


def compute_values(task, model, dataset, collator, accelerator: Accelerator, batch_size: int) -> np.ndarray:
    """``task.precompute`` over every row of ``dataset`` (longest first), in the rows' order, fp32 (rows, k)."""
    loader = eval_loader(dataset, batch_size, collator)
    order = np.asarray(list(loader.sampler))
    parts = []
    with torch.no_grad(), accelerator.autocast():
        for batch in loader:
            batch = to_device(batch, accelerator.device)
            parts.append(task.data.precompute(model, batch).float().cpu())
    values = np.empty((len(dataset), parts[0].shape[1] if parts else 0), dtype=np.float32)
    if parts:
        values[order] = torch.cat(parts).numpy()
    return values


def with_precomputed(task, model, dataset, collator, accelerator: Accelerator, batch_size: int, what: str):
    """``dataset`` with the task's precomputed columns added (from the cache when it holds them)."""
    columns = task.data.precomputed_columns(list(dataset.column_names)) if dataset is not None else ()
    if not columns or len(dataset) == 0:
        return dataset
    h = hashlib.sha256(model_fingerprint(model).encode())
    h.update(data_fingerprint(dataset).encode())
    h.update(f"{columns}/{accelerator.mixed_precision}/{compute_paths(model)}".encode())
    path = cache_file(dataset, h.hexdigest()[:32])
    with accelerator.main_process_first():
        values, problem = read_values(path, len(dataset), len(columns))
        if values is not None:
            log.info("%s: %s read from %s (computed before, same model and data)", what, ", ".join(columns), path)
        elif accelerator.is_main_process:
            if problem:
                log.warning("%s: %s: %s; computing them again", what, ", ".join(columns), problem)
            start = time.perf_counter()
            values = compute_values(task, model, dataset, collator, accelerator, batch_size)
            write_values(path, values)
            record_cache_folder(str(path.parent), f"{', '.join(columns)} of {what}")
            log.info("%s: %s computed for %d rows in %.1f s, cached at %s", what, ", ".join(columns), len(dataset),
                     time.perf_counter() - start, path)
    if values is None:  # another process computed it meanwhile (main_process_first): read it now
        values, problem = read_values(path, len(dataset), len(columns))
        if values is None:
            raise RuntimeError(f"{what}: {', '.join(columns)}: the main process's {path} cannot be read: {problem}")
    for i, name in enumerate(columns):
        dataset = dataset.add_column(name, values[:, i].tolist())
    return dataset
