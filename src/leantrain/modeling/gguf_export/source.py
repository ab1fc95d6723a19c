"""Where the exported tensors come from: a model folder's safetensors, read one tensor at a time, or, for a LoRA
adapter folder (``peft.merge=false``), its base with the adapter merged in memory (``merge_and_unload``), so that the
GGUF file holds the fine-tuned weights, never the base alone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from leantrain.errors import UserError
from leantrain.modeling.load import is_adapter_folder, load_adapter_model


class SafetensorsSource:
    """The tensors of a folder's safetensors files (one file or shards with an index), read one at a time."""

    def __init__(self, folder: Path):
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            self.files = {k: folder / v for k, v in json.loads(index.read_text())["weight_map"].items()}
        else:
            from safetensors import safe_open

            with safe_open(folder / "model.safetensors", framework="np") as f:
                self.files = {k: folder / "model.safetensors" for k in f.keys()}

    def names(self) -> list[str]:
        return list(self.files)

    def shape(self, name: str) -> tuple[int, ...]:
        from safetensors import safe_open

        with safe_open(self.files[name], framework="pt") as f:
            return tuple(f.get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        from safetensors import safe_open

        with safe_open(self.files[name], framework="pt") as f:
            return f.get_tensor(name).float().numpy()


class StateDictSource:
    """The tensors of a model in memory (a LoRA adapter merged over its base)."""

    def __init__(self, state: dict):
        self.state = state

    def names(self) -> list[str]:
        return list(self.state)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.state[name].shape)

    def get(self, name: str) -> np.ndarray:
        return self.state[name].detach().float().cpu().numpy()


@dataclass
class ExportSource:
    """What an export reads: the config, the tokenizer (and its folder, for the files gguf reads itself), the
    tensors, and the model when it is in memory (a merged adapter)."""

    config: object
    tokenizer: object
    tokenizer_folder: Path
    tensors: object  # SafetensorsSource | StateDictSource
    model: object | None = None
    merged: bool = False


def open_source(folder: Path) -> ExportSource:
    """The export source of a model folder or a LoRA adapter folder; exit 2 when it holds no safetensors weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if is_adapter_folder(str(folder)):
        model = load_adapter_model(str(folder), AutoModelForCausalLM, {"dtype": torch.float32})
        return ExportSource(model.config, tokenizer, folder, StateDictSource(model.state_dict()), model, merged=True)
    if not (folder / "model.safetensors").is_file() and not (folder / "model.safetensors.index.json").is_file():
        raise UserError(f"{folder}: no model.safetensors (or model.safetensors.index.json); leantrain exports "
                        "safetensors weights")
    return ExportSource(AutoConfig.from_pretrained(folder), tokenizer, folder, SafetensorsSource(folder))
