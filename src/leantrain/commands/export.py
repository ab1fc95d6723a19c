"""``leantrain export FOLDER --format gguf --outtype f32|f16|bf16|q8_0 [--output FILE] [--check]``: a causal LM
folder (a run's model/, a run folder, a LoRA adapter folder, or the smollm2-135m preset) as one GGUF file for
llama.cpp / Ollama / LM Studio, an Ollama ``Modelfile`` beside it, and with ``--check`` the file read back by
transformers and compared with the folder (``modeling/gguf_export/check.py``). Exit 0 when written (and, with
--check, the check passed), 1 when the check failed, 2 for bad input."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from leantrain.commands.generate import model_folder
from leantrain.engine.devices.accelerator import setup_logging
from leantrain.engine.setup.preflight import check_weights
from leantrain.errors import UserError
from leantrain.files import write_atomic
from leantrain.units import format_bytes
from leantrain.modeling.gguf_export.check import compare
from leantrain.modeling.gguf_export.modelfile import modelfile
from leantrain.modeling.gguf_export.source import open_source
from leantrain.modeling.gguf_export.write import OUTTYPES, write_gguf

log = logging.getLogger("leantrain")

FORMATS = ("gguf",)


def default_output(name: str, folder: Path, outtype: str) -> Path:
    """Beside the folder (runs/x/model -> runs/x/model.q8_0.gguf); a preset or Hub model: in the working folder."""
    if Path(name).expanduser().exists():
        return folder.with_name(f"{folder.name}.{outtype}.gguf")
    return Path.cwd() / f"{Path(name).name}.{outtype}.gguf"


def write_modelfile(src, gguf_path: Path) -> Path:  # noqa: ANN001 - an ExportSource
    """``Modelfile`` beside the GGUF file (the latest export's)."""
    generation = {}
    gen_file = src.tokenizer_folder / "generation_config.json"
    if gen_file.is_file():
        generation = json.loads(gen_file.read_text())
    path = gguf_path.parent / "Modelfile"
    write_atomic(path, modelfile(gguf_path.name, src.tokenizer.chat_template, src.tokenizer.eos_token,
                                 src.config.max_position_embeddings, generation))
    return path


def export_command(name: str, *, fmt: str = "gguf", outtype: str = "f16", output: str | None = None,
                   check: bool = False, new_tokens: int = 8) -> int:
    """``leantrain export``: write the file (and Modelfile), print what was written; ``--check``: the comparison."""
    setup_logging(True)
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: leantrain exports {', '.join(FORMATS)}")
    if outtype not in OUTTYPES:
        raise UserError(f"--outtype {outtype}: one of {', '.join(OUTTYPES)}")
    folder = Path(model_folder(name))
    if not (folder / "config.json").is_file() and (folder / "adapter" / "adapter_config.json").is_file():
        folder = folder / "adapter"  # a LoRA run with peft.merge=false: its adapter, merged below
    if not folder.is_dir():
        raise UserError(f"{name}: not a local model folder; export a run's model/ folder (or a run folder)")
    check_weights(str(folder), allow_pickle=False)
    path = Path(output).expanduser() if output else default_output(name, folder, outtype)
    if path.is_dir():
        raise UserError(f"--output {output}: is a folder; give a file name in it, e.g. {path / 'model.gguf'}")
    src = open_source(folder)
    if src.merged:
        log.info("%s is a LoRA adapter: merged into its base before export", folder)
    result = write_gguf(src, path, outtype, folder.name if folder.name != "model" else folder.parent.name)
    mf = write_modelfile(src, path)
    print(f"wrote {path} ({format_bytes(result.bytes)}, {result.tensors} tensors, {result.arch}, {outtype}, "
          f"pre-tokenizer {result.pre_tokenizer}) in {result.seconds:.1f} s")
    print(f"wrote {mf}: ollama create NAME -f {mf} && ollama run NAME")
    if not check:
        return 0
    model = src.model
    if model is None:
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    report = compare(model, src.tokenizer, path, outtype, new_tokens=new_tokens)
    for line in report.lines():
        print(line)
    return 0 if report.passed else 1
