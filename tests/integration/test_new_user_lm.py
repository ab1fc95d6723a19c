"""What a new user hit on other tools' instruction data and LoRA runs (issue 26, part 4), on a tiny Llama with a
ChatML tokenizer (no pad token): the run's output says each thing once and in the unit that fits."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from leantrain.cli import main
from tests.helpers import CHATML, make_tiny_chat_tokenizer, make_tiny_llama


def jsonl(path, data):
    path.write_text("".join(json.dumps(x) + "\n" for x in data))
    return str(path)


def alpaca(n: int) -> list[dict]:
    return [{"instruction": f"What is {i % 7} and 2", "output": "The answer is 4. Hello world" * (1 + i % 3)}
            for i in range(n)]


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """One packed SFT run (Alpaca rows, held-out eval file): (root, exit code, stdout, stderr)."""
    root = tmp_path_factory.mktemp("newuser-lm")
    model = make_tiny_llama(root / "model", make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML))
    code, out, err = run_cli("train", f"model.name={model}", f"data.train={jsonl(root / 'train.jsonl', alpaca(40))}",
                             f"data.eval={jsonl(root / 'eval.jsonl', alpaca(20))}", "data.block_size=128",
                             "train.max_steps=3", "train.batch_size=8", "report.plots=false",
                             "efficiency.precision=bf16",  # evaluated under bf16 autocast, saved fp32
                             "report.progress=none", f"output_dir={root / 'run'}")
    assert code == 0, err[-3000:]
    return root, out, err


def test_pad_token_and_final_eval_line_are_said_once_with_blocks_and_tokens_per_second(sft):
    _, out, err = sft
    assert err.count("the tokenizer has no pad token") == 1
    assert out.count("eval loss:") == 1 and "eval loss:" not in err.split("eval @ step 3")[-1]
    assert "on 9 blocks (of 20 examples) in bf16  (3 steps, " in out and " tokens/s) -> " in out


def test_predict_on_a_language_model_points_to_generate_and_eval(sft):
    root, _, _ = sft
    model = root / "run" / "model"
    code, _, err = run_cli("predict", str(model), "--input", str(root / "eval.jsonl"), "--output",
                           str(root / "p.jsonl"))
    assert code == 2 and "is a language model" in err and "Traceback" not in err
    assert f"leantrain generate {model} --prompt" in err and f"leantrain eval {model} data.eval=" in err


def test_eval_of_the_saved_model_agrees_with_the_run_in_the_runs_precision(sft):
    """The run evaluated under bf16 autocast; `leantrain eval` used fp32 and disagreed in the 5th digit. It now
    takes the run's precision from model/leantrain.json (bitwise the same loss), or efficiency.precision."""
    root, _, _ = sft
    summary = json.loads((root / "run" / "summary.json").read_text())
    model, data = str(root / "run" / "model"), f"data.eval={root / 'eval.jsonl'}"
    code, _, err = run_cli("eval", model, data, "--output", str(root / "same.json"))
    same = json.loads((root / "same.json").read_text())
    assert code == 0 and "precision: bf16 (the training run's, from" in err
    assert same["precision"] == "bf16" and same["eval"]["loss"] == summary["eval"]["loss"]
    code, _, err = run_cli("eval", model, data, "efficiency.precision=fp32", "--output", str(root / "fp32.json"))
    fp32 = json.loads((root / "fp32.json").read_text())
    assert code == 0 and fp32["precision"] == "fp32" and "precision: fp32 (efficiency.precision" in err
    assert fp32["eval"]["loss"] != summary["eval"]["loss"]
    assert fp32["eval"]["loss"] == pytest.approx(summary["eval"]["loss"], rel=1e-2)


def test_one_step_lora_run_trains_the_adapter_at_the_adapter_default_lr(sft):
    """train.max_steps=1 with the default warm-up: the step runs at a non-zero lr, so lora_B (zero at the start)
    moves; train.lr unset under LoRA is 2e-4; the checkpoint-free run still saves the adapter."""
    from safetensors.torch import load_file

    root, _, _ = sft
    out = root / "lora1"
    code, _, err = run_cli("train", f"model.name={root / 'model'}", f"data.train={root / 'train.jsonl'}",
                           f"data.eval={root / 'eval.jsonl'}", "data.block_size=128", "peft.method=lora", "peft.r=4",
                           "train.max_steps=1", "train.batch_size=8", "report.plots=false", "report.progress=none",
                           f"output_dir={out}")
    assert code == 0, err[-3000:]
    assert "lr: 0.0002" in (out / "config.yaml").read_text()
    [record] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
                if json.loads(line)["type"] == "train"]
    assert record["lr"] == pytest.approx(1e-4)  # warm-up step 0 of 1: (0 + 1) / (1 + 1) of the peak
    adapter = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in adapter.items())
