"""A model folder written as one GGUF file, tensor by tensor.

The tensors are read one at a time (``source.py``: safetensors are memory-mapped; a LoRA adapter folder is merged in
memory first),
converted (Q/K permuted for llama, cast or quantised in numpy by ``gguf.quants``) and appended: the peak is about one
tensor beside the source, not the model twice. The file is written beside its destination and renamed into place
(``files.atomic_file``): an interrupted export leaves no half file.

Types per ``--outtype``: 1-D tensors (norms, biases) stay F32 as in llama.cpp's converter; matrices become F32, F16,
BF16 or Q8_0 (blocks of 32 values with one f16 scale); a matrix whose rows are not a multiple of 32 long stays F16
under q8_0, as llama.cpp does."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np

from leantrain.files import atomic_file
from leantrain.modeling.gguf_export.arch import GgufArch, gguf_arch, hparams, permute_qk, tensor_plan
from leantrain.modeling.gguf_export.source import ExportSource
from leantrain.modeling.gguf_export.vocab import add_vocab, read_vocab

log = logging.getLogger("leantrain")

OUTTYPES = ("f32", "f16", "bf16", "q8_0")


def tensor_type(outtype: str, shape: tuple[int, ...]):
    """The GGML type of a tensor of ``shape`` under ``outtype``."""
    import gguf  # lazy: the optional gguf package

    T = gguf.GGMLQuantizationType
    if len(shape) < 2 or outtype == "f32":
        return T.F32
    if outtype == "q8_0" and shape[-1] % gguf.GGML_QUANT_SIZES[T.Q8_0][0]:
        return T.F16
    return {"f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0}[outtype]


def converted(array: np.ndarray, qtype) -> np.ndarray:  # noqa: ANN001 - a GGMLQuantizationType
    """``array`` (float32) in ``qtype``: float32 / float16 arrays, or the bytes of BF16 / Q8_0 blocks."""
    import gguf  # lazy: the optional gguf package

    T = gguf.GGMLQuantizationType
    if qtype == T.F32:
        return np.ascontiguousarray(array, dtype=np.float32)
    if qtype == T.F16:
        return np.ascontiguousarray(array, dtype=np.float16)
    return gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype)


def declare(writer, name: str, shape: tuple[int, ...], qtype) -> None:  # noqa: ANN001
    """The tensor's entry in the header (name, shape, type, size), before any data is written."""
    import gguf  # lazy: the optional gguf package

    T = gguf.GGMLQuantizationType
    if qtype in (T.F32, T.F16):
        dtype = np.float32 if qtype == T.F32 else np.float16
        writer.add_tensor_info(name, shape, np.dtype(dtype), prod(shape) * np.dtype(dtype).itemsize)
    else:
        byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
        writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), prod(byte_shape), raw_dtype=qtype)


@dataclass
class ExportResult:
    path: Path
    arch: str
    outtype: str
    tensors: int
    bytes: int
    pre_tokenizer: str
    seconds: float


def file_type(outtype: str) -> int:
    import gguf  # lazy: the optional gguf package

    F = gguf.LlamaFileType
    return int({"f32": F.ALL_F32, "f16": F.MOSTLY_F16, "bf16": F.MOSTLY_BF16, "q8_0": F.MOSTLY_Q8_0}[outtype])


def write_gguf(src: ExportSource, output: Path, outtype: str, name: str) -> ExportResult:
    """Write ``src``'s tensors with its config's hyper-parameters and its tokenizer to ``output`` (atomically), as
    ``outtype``; ``name`` is general.name (and names the model in errors)."""
    import gguf  # lazy: the optional gguf package

    start = time.perf_counter()
    config, source = src.config, src.tensors
    arch: GgufArch = gguf_arch(config, name)
    shapes = {n: source.shape(n) for n in source.names()}
    n_vocab = shapes["model.embed_tokens.weight"][0]
    vocab = read_vocab(src.tokenizer_folder, src.tokenizer, n_vocab)
    plan = tensor_plan(config, arch, list(shapes))
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(output) as tmp:
        writer = gguf.GGUFWriter(tmp, arch.name)
        writer.add_type(gguf.GGUFType.MODEL)
        writer.add_name(name)
        writer.add_file_type(file_type(outtype))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        for key, value, kind in hparams(config, arch, n_vocab):
            (writer.add_uint32 if kind == "uint32" else writer.add_float32)(key, value)
        add_vocab(writer, vocab, src.tokenizer_folder, src.tokenizer)
        types = [tensor_type(outtype, shapes[hf]) for _, hf, _ in plan]
        for (gname, hf, _), qtype in zip(plan, types):
            declare(writer, gname, shapes[hf], qtype)
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for (gname, hf, heads), qtype in zip(plan, types):
            array = source.get(hf)
            if heads is not None:
                array = permute_qk(array, heads)
            writer.write_tensor_data(converted(array, qtype))
        writer.close()
    return ExportResult(output, arch.name, outtype, len(plan), output.stat().st_size, vocab.pre,
                        time.perf_counter() - start)
