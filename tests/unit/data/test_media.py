"""Audio files decoded and checked by path, image / audio processors built from a config, and the task detected
from the config (no shared data: synthetic WAV files; the image-folder and training tests on ../shared/data are in
tests/integration/test_media.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from leantrain.cli import main
from leantrain.config import DataConfig, resolve
from leantrain.data import audio
from leantrain.errors import DataError
from leantrain.methods import resolve_task
from leantrain.methods import get_task
from tests.helpers import TINY_AST, TINY_VIT, write_rows

pytestmark = pytest.mark.usefixtures("own_datasets_cache")  # each test its own Arrow cache, never ~/.cache


def _wav(path: Path, seconds: float, rate: int, channels: int = 1) -> Path:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    x = np.stack([np.sin(2 * np.pi * 440 * t) * (c + 1) / 4 for c in range(channels)], axis=1)
    sf.write(path, x.astype(np.float32), rate)
    return path


def test_audio_decoding_mono_resampled_capped(tmp_path):
    stereo = _wav(tmp_path / "st.wav", 2.0, 44100, channels=2)
    x = audio.read_audio(str(stereo), 16000)
    assert x.dtype == np.float32 and abs(len(x) - 32000) <= 2  # 2 s at 16 kHz
    assert abs(np.abs(x).max() - 0.375) < 0.01  # the mean of the two channels (0.25 and 0.5 amplitude)
    assert len(audio.read_audio(str(stereo), 16000, max_seconds=0.5)) == 8000


def test_bad_audio_files_reported_by_path(tmp_path):
    good = [_wav(tmp_path / f"{i}.wav", 0.3, 8000) for i in range(3)]
    (tmp_path / "noise.wav").write_bytes(b"RIFF....WAVEfmt garbage")
    (tmp_path / "empty.wav").write_bytes(b"")
    rows = [{"clip": f.name, "digit": i % 2} for i, f in enumerate(good)] + [
        {"clip": "noise.wav", "digit": 0}, {"clip": "empty.wav", "digit": 1}, {"clip": "gone.wav", "digit": 1}]
    csv = write_rows(tmp_path / "clips.csv", rows)
    with pytest.raises(DataError) as e:
        audio.load_and_validate(DataConfig(train=str(csv), audio_column="clip"), seed=0, batch_size=2)
    text = str(e.value)
    for name in ("noise.wav", "empty.wav", "gone.wav"):
        assert str(tmp_path / name) in text
    assert "0.wav" not in text.replace("noise.wav", "")


def test_processors_built_from_the_config(tmp_path):
    from transformers import AutoFeatureExtractor, AutoImageProcessor

    from leantrain.modeling import load_processor

    vit = resolve(None, TINY_VIT).model
    proc = load_processor(vit, get_task("image-classification"))
    assert proc.size["height"] == 32  # the config's image size, not ViT's default 224
    proc.save_pretrained(tmp_path / "v")
    assert AutoImageProcessor.from_pretrained(tmp_path / "v").size["height"] == 32
    w2v = resolve(None, ["model.config_type=wav2vec2", "model.config_overrides.feat_extract_norm=layer"]).model
    fe = load_processor(w2v, get_task("audio-classification"))
    assert fe.return_attention_mask and fe.sampling_rate == 16000
    ast = load_processor(resolve(None, TINY_AST).model, get_task("audio-classification"))
    assert (ast.num_mel_bins, ast.max_length) == (32, 100)
    fe.save_pretrained(tmp_path / "a")
    assert AutoFeatureExtractor.from_pretrained(tmp_path / "a").return_attention_mask


def test_task_auto_detection(tmp_path):
    assert resolve_task(resolve(None, TINY_VIT)).name == "image-classification"
    assert resolve_task(resolve(None, TINY_AST)).name == "audio-classification"
    assert resolve_task(resolve(None, [])).name == "text-classification"
    assert resolve_task(resolve(None, ["data.audio_column=f"])).name == "audio-classification"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "convnext", "image_size": 32}))
    assert resolve_task(resolve(None, [f"model.config={tmp_path / 'config.json'}"])).name == "image-classification"
    assert main(["train", "model.config_type=vitt"]) == 2  # unknown type: a config error ("did you mean 'vit'")
