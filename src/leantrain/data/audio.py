"""Audio inputs: files checked by their header up front (soundfile), then decoded once with ``datasets.map``
(cached): mono mixdown, resampling to the feature extractor's rate (soxr), cut to ``data.max_seconds``. The
collator runs the feature extractor per batch, padding to the batch's longest clip with an attention mask where
the extractor gives one. ``length`` is the clip's duration in samples, so length-grouped batching groups clips
of similar duration (least padding)."""

from __future__ import annotations

import math

import numpy as np
import torch

from leantrain.config import DataConfig
from leantrain.data import media
from leantrain.errors import DataError

EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".aifc", ".au", ".caf", ".w64")


def _soundfile():
    try:
        import soundfile
    except ImportError:
        raise DataError("audio needs soundfile and soxr: pip install 'leantrain[audio]'") from None
    return soundfile


def probe(path: str) -> str | None:
    """Why soundfile cannot read the file's header (or the file holds no samples), or None."""
    try:
        info = _soundfile().info(path)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - libsndfile's own message says what is wrong
        return f"{type(e).__name__}: {str(e).strip()}"
    return "no audio frames" if info.frames == 0 else None


KIND = media.MediaKind("audio", "data.audio_column", EXTENSIONS, probe, ("audio", "audio_path", "audio_file", "wav"))


def load_and_validate(cfg: DataConfig, *, seed: int, batch_size: int, known_labels: list[str] | None = None):
    return media.load_and_validate(cfg, KIND, seed=seed, batch_size=batch_size, known_labels=known_labels)


def load_rows(path: str, cfg: DataConfig, *, require_labels: bool, known_labels: list[str] | None):
    return media.load_rows(path, cfg, KIND, require_labels=require_labels, known_labels=known_labels)


def read_audio(path: str, rate: int, max_seconds: float | None = None) -> np.ndarray:
    """Mono float32 samples at ``rate``, at most ``max_seconds`` long; DataError naming the path."""
    import soxr

    sf = _soundfile()
    try:
        with sf.SoundFile(path) as f:
            frames = -1 if max_seconds is None else math.ceil(max_seconds * f.samplerate)
            x, sr = f.read(frames, dtype="float32", always_2d=True), f.samplerate
    except Exception as e:  # noqa: BLE001
        raise DataError(f"cannot decode audio file {path} ({type(e).__name__}: {str(e).strip()})") from None
    x = x.mean(axis=1)
    if sr != rate:
        x = soxr.resample(x, sr, rate)
    if max_seconds is not None:
        x = x[: math.ceil(max_seconds * rate)]
    return np.ascontiguousarray(x, dtype=np.float32)


def _decode(batch: dict[str, list], rate: int, max_seconds: float | None) -> dict[str, list]:
    clips = [read_audio(p, rate, max_seconds) for p in batch["audio"]]
    return {"audio": clips, "length": [len(c) for c in clips]}


def process(dataset, extractor, cfg: DataConfig, desc: str = "Decoding audio"):
    """Canonical (audio path, [label]) -> (audio samples, [labels], length); cached by ``datasets``."""
    import datasets

    features = datasets.Features({**{k: v for k, v in dataset.features.items() if k != "audio"},
                                  "audio": datasets.List(datasets.Value("float32")), "length": datasets.Value("int64")})
    out = dataset.map(_decode, batched=True, batch_size=64, remove_columns=["audio"], features=features, desc=desc,
                      fn_kwargs={"rate": extractor.sampling_rate, "max_seconds": cfg.max_seconds})
    return out.rename_column("label", "labels") if "label" in out.column_names else out


class AudioCollator:
    """Rows (samples, [labels], loss_weight) -> the extractor's tensors (input_values, [attention_mask]) + labels
    + loss_weight, padded to the longest clip of the batch."""

    def __init__(self, extractor):
        import inspect

        self.extractor = extractor
        self.kwargs = {"sampling_rate": extractor.sampling_rate, "return_tensors": "pt"}
        if "padding" in inspect.signature(extractor.__call__).parameters:
            self.kwargs["padding"] = "longest"

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        clips = [np.asarray(r["audio"], dtype=np.float32) for r in rows]
        out = {k: v for k, v in self.extractor(clips, **self.kwargs).items()}
        if "labels" in rows[0]:
            out["labels"] = torch.tensor([r["labels"] for r in rows], dtype=torch.long)
        out["loss_weight"] = torch.tensor([r.get("loss_weight", 1.0) for r in rows], dtype=torch.float32)
        return out


def collator(extractor, cfg: DataConfig, *, train: bool, seed: int = 0, device_type: str = "cpu") -> AudioCollator:
    return AudioCollator(extractor)
