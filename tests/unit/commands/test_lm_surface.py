"""The language-model surface keeps the classifier surface's promises (issue 27): generate's settings, the position
limit in eval and in sample generation, model.config_overrides through the number checks, LoRA's rank and targets,
an adapter folder (peft.merge=false) loaded over its base. One tiny Llama (64 positions) for all of them."""

from __future__ import annotations

import json
import warnings

import pytest

from leantrain.cli import main
from tests.helpers import TINY_LLAMA, lm_documents, make_tiny_llama, make_tiny_lm_tokenizer

pytestmark = pytest.mark.usefixtures("own_datasets_cache")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """(tiny Llama folder with 64 positions, its tokenizer folder, train.txt, eval.txt)."""
    root = tmp_path_factory.mktemp("lm-surface")
    tok = make_tiny_lm_tokenizer(root / "tok")
    model = make_tiny_llama(root / "model", tok, positions=64)
    docs = lm_documents(40, 0, min_words=20, max_words=40)
    (root / "train.txt").write_text("\n\n".join(docs[:32]))
    (root / "eval.txt").write_text("\n\n".join(docs[32:]))
    return model, tok, root / "train.txt", root / "eval.txt"


def _err(capsys) -> str:
    return capsys.readouterr().err


# ------------------------------------------------------------------------------------------ item 6: generate


@pytest.mark.parametrize("args, says", [
    (["--prompt", ""], "--prompt 1 is empty"),
    (["--prompt", "a", "--prompt", "  "], "--prompt 2 is empty"),
    (["--prompt", "hello", "--max-new-tokens", "1000000"], "at most 63 new tokens"),
    (["--prompt", "hello world", "--max-new-tokens", "63"], "max_position_embeddings=64"),
    (["--prompt", "hello", "--temperature", "1", "--seed", "99999999999999999999"], "--seed"),
    (["--prompt", "hello", "--temperature", "1", "--seed", "-1"], "--seed"),
    (["--prompt", "hello", "--temperature", "nan"], "--temperature must be a finite number"),
    (["--prompt", "hello", "--temperature", "inf"], "--temperature must be a finite number"),
    (["--prompt", "hello", "--temperature", "1", "--top-p", "nan"], "--top-p must be a finite number"),
])
def test_generate_refuses_what_it_cannot_handle(lm, capsys, args, says):
    assert main(["generate", str(lm[0]), "--no-chat", *args]) == 2
    err = _err(capsys)
    assert says in err and "Traceback" not in err


def test_generate_fills_the_positions_exactly(lm, capsys):
    """Prompt (2 tokens with the word-level tokenizer) + 62 new tokens = the model's 64 positions: allowed."""
    assert main(["generate", str(lm[0]), "--no-chat", "--prompt", "hello world", "--max-new-tokens", "62",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_new_tokens"] == 62


# ------------------------------------------------------------------------------------------ items 8, 9: the model


@pytest.mark.parametrize("override, says", [
    ("model.config_overrides.hidden_size=63", "hidden_size=63 is not divisible by num_attention_heads=2"),
    ("model.config_overrides.num_key_value_heads=3", "not divisible by num_key_value_heads=3"),
    ("model.config_overrides.num_attention_heads=0", "num_attention_heads=0: a count, so at least 1"),
    ("model.config_overrides.initializer_range=.inf", "initializer_range=inf: must be a finite number"),
    ("model.config_overrides.rms_norm_eps=.nan", "rms_norm_eps=nan: must be a finite number"),
    ("model.config_overrides.hidden_size=1e9", "hidden_size='1e9': the config holds a whole number"),
    ("model.config_overrides.hidden_size=100000000", "more than this machine's"),
    ("model.config_overrides.max_position_embeddings=0", "max_position_embeddings=0: a count"),
    ("model.config_overrides.max_position_embeddings=-1", "max_position_embeddings=-1: a count"),
    ("peft.r=1000000", "peft.r=1000000 is more than the target layers' rank allows"),
    ("peft.target_modules=[q_proj,nothing]", "is named 'nothing'"),
])
def test_model_numbers_and_lora_are_checked_before_the_model_loads(lm, tmp_path, capsys, override, says):
    peft = ["peft.method=lora"] if override.startswith("peft") else []
    assert main(["train", *TINY_LLAMA, f"model.tokenizer={lm[1]}", f"data.train={lm[2]}", *peft, override,
                 f"output_dir={tmp_path / 'run'}"]) == 2
    err = _err(capsys)
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing started
    if "nothing" in override:
        assert "the model's Linear modules: q_proj, k_proj, v_proj, o_proj" in err


# ------------------------------------------------------------------------------------------ items 10, 11: positions


def test_eval_enforces_the_position_limit(lm, capsys):
    assert main(["eval", str(lm[0]), f"data.eval={lm[3]}", "data.block_size=1000"]) == 2
    assert "data.block_size=1000 is more than the model takes" in _err(capsys)


def test_sample_max_new_tokens_past_the_positions_is_refused_before_the_model(lm, tmp_path, capsys):
    assert main(["train", f"model.name={lm[0]}", f"data.train={lm[2]}", "data.block_size=32",
                 "report.sample_prompts=[hello world]", "report.sample_max_new_tokens=200",
                 f"output_dir={tmp_path / 'run'}"]) == 2
    err = _err(capsys)
    assert "report.sample_max_new_tokens=200 is more than the model takes" in err and "at most 62 new tokens" in err
    assert "model:" not in err  # the model was not built


# ------------------------------------------------------------------------------------------ item 7: the adapter


def test_an_adapter_folder_is_evaluated_over_its_base(lm, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", f"model.name={lm[0]}", f"data.train={lm[2]}", f"data.eval={lm[3]}", "data.block_size=32",
                 "train.max_steps=3", "train.batch_size=4", "train.lr=1e-2", "peft.method=lora", "peft.merge=false",
                 "report.plots=false", "report.progress=none", f"output_dir={out}"]) == 0
    capsys.readouterr()
    run_loss = json.loads((out / "summary.json").read_text())["eval"]["loss"]
    with warnings.catch_warnings(record=True) as seen:  # nothing that is not about the user's run (issue 26)
        warnings.simplefilter("always")
        assert main(["eval", str(out / "adapter"), f"data.eval={lm[3]}"]) == 0
        assert json.loads(capsys.readouterr().out)["loss"] == pytest.approx(run_loss, abs=2e-4)  # merged: rounding
        assert main(["generate", str(out / "adapter"), "--no-chat", "--prompt", "hello", "--max-new-tokens", "3"]) == 0
    assert not [w for w in seen if "is_gradient_checkpointing" in str(w.message)]


def test_an_adapter_over_a_model_from_a_config_is_refused_with_the_reason(lm, tmp_path, capsys):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": None, "peft_type": "LORA"}))
    for name in ("config.json", "model.safetensors"):
        (adapter / name).write_bytes((lm[0] / name).read_bytes())
    assert main(["eval", str(adapter), f"data.eval={lm[3]}", "data.block_size=32"]) == 2
    assert "peft.merge=true" in _err(capsys)


# ------------------------------------------------------------------------------------------ item 15: resume


def test_a_resume_refused_for_changed_data_builds_no_model(lm, tmp_path, capsys, caplog):
    train = tmp_path / "train.txt"
    train.write_text(lm[2].read_text())
    args = ["train", f"model.name={lm[0]}", f"data.train={train}", "data.block_size=32", "train.max_steps=2",
            "train.batch_size=4", "checkpoint.every_steps=1", "checkpoint.keep_final=1", "report.plots=false",
            "report.progress=none", f"output_dir={tmp_path / 'run'}"]
    assert main(args) == 0
    (tmp_path / "run" / "summary.json").unlink()  # so the rerun resumes from the kept checkpoint
    train.write_text(" ".join(reversed(lm[2].read_text().split())))
    caplog.clear()
    assert main(args) == 2
    assert "the training data changed" in _err(capsys)
    assert not any(r.getMessage().startswith("model:") for r in caplog.records)  # refused before the model


# ------------------------------------------------------------------------------------------ also: SIGTERM in eval


def test_an_evaluation_stops_at_the_next_batch_when_asked(lm):
    """What a signal during a mid-run evaluation does (one process): the evaluation ends after the batch in hand
    and returns nothing to record."""
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from leantrain.config import Config
    from leantrain.engine.evaluation.evaluate import evaluate
    from leantrain.methods import get_task

    model = AutoModelForCausalLM.from_pretrained(lm[0])
    ids = torch.arange(2, 18).reshape(2, 8)
    batches = [{"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}] * 4
    seen = []

    def stop() -> bool:
        seen.append(1)
        return len(seen) >= 2

    task = get_task("causal-lm").configured(Config())
    assert evaluate(model, batches, Accelerator(cpu=True), 0, task, None, stop) is None
    assert len(seen) == 2  # two batches computed, not four
    assert evaluate(model, batches, Accelerator(cpu=True), 0, task)["loss"] > 0
