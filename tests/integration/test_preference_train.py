"""Preference tuning end to end through the CLI on a tiny random Llama and a tiny BERT: DPO with LoRA (the reference
is the model with its adapters off; model/ merged loads with pipeline("text-generation") without peft; leantrain eval
reports reward accuracy and margin against the recorded reference), DPO without LoRA (reference log-probs
precomputed once, read back by the next run), KTO on prompt/completion/label data, and a reward model (pairwise
accuracy, pipeline("text-classification", function_to_apply="none"), leantrain predict one score per text)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from leantrain.cli import main
from tests.helpers import CHATML, make_tiny_bert, make_tiny_chat_tokenizer, make_tiny_llama, write_jsonl

pytestmark = pytest.mark.usefixtures("own_datasets_cache")
WORDS = ["Hello world.", "The answer is 4.", "Eat well.", "Numbers.", "The weather is red.", "It learned."]
NO_PEFT = """
import sys
sys.modules["peft"] = None  # `import peft` raises ImportError from here on
from transformers import pipeline
out = pipeline("text-generation", model=sys.argv[1])("Hello", max_new_tokens=3, do_sample=False)
print("generated", len(out[0]["generated_text"]) > 0)
"""


def pair_rows(n: int, seed: int) -> list[dict]:
    """Questions whose chosen answer is always the first word list's, the rejected another: a learnable preference."""
    rows = []
    for i in range(n):
        j = (i + seed) % len(WORDS)
        rows.append({"prompt": f"What is {i % 5} + {seed}?", "chosen": WORDS[j],
                     "rejected": WORDS[(j + 1 + i % 4) % len(WORDS)] + " Numbers?"})
    return rows


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("preference")
    tok = make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML)
    make_tiny_llama(root / "llama", tok, layers=1, hidden=16)
    write_jsonl(root / "prefs.jsonl", pair_rows(16, 0))
    write_jsonl(root / "prefs_dev.jsonl", pair_rows(6, 3))
    write_jsonl(root / "feedback.jsonl", [{"prompt": r["prompt"], "completion": r["chosen" if i % 2 else "rejected"],
                                           "label": bool(i % 2)} for i, r in enumerate(pair_rows(16, 1))])
    return root


def args(root: Path, out: str, *extra: str) -> list[str]:
    return ["train", f"model.name={root / 'llama'}", f"data.train={root / 'prefs.jsonl'}",
            f"data.eval={root / 'prefs_dev.jsonl'}", "data.block_size=64", "train.batch_size=4",
            "train.micro_batch_size=2", "train.max_steps=3", "train.lr=5e-3", "report.plots=false",
            "report.progress=none", "efficiency.precision=fp32", "checkpoint.every_steps=0",
            f"output_dir={root / out}", *extra]


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_dpo_with_lora_via_the_cli_then_eval_and_a_merged_model_without_peft(root, capfd, tmp_path):
    pytest.importorskip("peft")
    assert main(args(root, "dpo-lora", "peft.method=lora", "peft.r=4", "peft.alpha=8")) == 0
    assert "task: preference (model.task=auto" in capfd.readouterr().err
    run = root / "dpo-lora"
    s = summary(run)
    ev = s["eval"]
    for key in ("reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward", "chosen_logps",
                "rejected_logps", "loss"):
        assert key in ev, key
    assert ev["samples"] == 6 and 0 <= ev["reward_accuracy"] <= 1
    assert 0 < s["model"]["trainable_parameters"] < s["model"]["total_parameters"]
    assert s["train"]["tokens_per_second"] > 0 and s["train"]["peak_memory_bytes"] > 0
    recorded = json.loads((run / "model" / "leantrain.json").read_text())
    assert recorded["task"] == "preference"
    assert recorded["preference"] == {"loss": "dpo", "beta": 0.1, "gamma": 0.5, "label_smoothing": 0.0,
                                      "desirable_weight": 1.0, "undesirable_weight": 1.0, "reference": "adapter",
                                      "reference_model": str(root / "llama")}
    card = (run / "model" / "README.md").read_text()
    assert "Method: dpo, beta 0.1; reference:" in card and "(adapter)" in card
    out = tmp_path / "m.json"
    assert main(["eval", str(run / "model"), f"data.eval={root / 'prefs_dev.jsonl'}", "--output", str(out)]) == 0
    got = json.loads(out.read_text())["eval"]
    # the merged policy against its recorded reference: the metrics of the run's last evaluation
    assert got["reward_accuracy"] == pytest.approx(ev["reward_accuracy"])
    assert got["reward_margin"] == pytest.approx(ev["reward_margin"], abs=1e-4)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", NO_PEFT, str(run / "model")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "generated True"


@pytest.mark.distributed
def test_dpo_without_lora_precomputes_the_reference_once_and_two_processes_train_the_same(root, capfd):
    """Reference log-probs computed by the first run and read by the second, which runs as 2 processes x
    accumulation 1 and trains the same model as 1 process x accumulation 2 (parameters, per-step losses, eval over
    5 pairs, uneven over the processes)."""
    from tests.helpers import cli_here
    from tests.processes import assert_same_training

    write_jsonl(root / "prefs_5.jsonl", pair_rows(5, 2))
    common = [a for a in args(root, "x", "train.log_every_steps=1", f"data.eval={root / 'prefs_5.jsonl'}",
                              f"data.cache_dir={root / 'datasets-cache'}")[1:] if not a.startswith("output_dir=")]
    assert main(["train", *common, f"output_dir={root / 'one'}"]) == 0
    assert "train data: ref_chosen_logps, ref_rejected_logps computed for 16 rows" in capfd.readouterr().err
    r = cli_here("train", "--nproc", "2", *common, f"output_dir={root / 'two'}")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "train data: ref_chosen_logps, ref_rejected_logps read from" in r.stderr
    assert_same_training(root / "one", root / "two")
    one, two = summary(root / "one"), summary(root / "two")
    assert one["eval"]["samples"] == two["eval"]["samples"] == 5
    assert one["eval"]["reward_margin"] == pytest.approx(two["eval"]["reward_margin"], rel=1e-4, abs=1e-6)
    assert json.loads((root / "one" / "model" / "leantrain.json").read_text())["preference"]["reference"] \
        == "precompute"


def test_kto_on_prompt_completion_label_data(root):
    assert main(args(root, "kto", f"data.train={root / 'feedback.jsonl'}", "data.eval=null",
                     "data.eval_fraction=0.25")) == 0
    ev = summary(root / "kto")["eval"]
    assert {"kl", "loss", "chosen_reward", "rejected_reward", "reward_margin"} <= set(ev)
    assert json.loads((root / "kto" / "model" / "leantrain.json").read_text())["preference"]["loss"] == "kto"


def test_reward_model_on_pairs_pairwise_accuracy_pipeline_and_predict(root, tmp_path, capfd):
    from transformers import pipeline

    bert = make_tiny_bert(tmp_path / "bert", layers=1, hidden=16, dropout=0.1)
    assert main(["train", f"model.name={bert}", f"data.train={root / 'prefs.jsonl'}",
                 f"data.eval={root / 'prefs_dev.jsonl'}", "train.batch_size=4", "train.max_steps=3",
                 "preference.center_rewards=0.01", "efficiency.precision=fp32", "report.plots=false",
                 "report.progress=none",
                 "checkpoint.every_steps=0", f"output_dir={tmp_path / 'rm'}"]) == 0
    s = summary(tmp_path / "rm")
    assert "dropout: off in" in capfd.readouterr().err  # preference.dropout=off by default, as TRL
    assert json.loads((tmp_path / "rm" / "model" / "leantrain.json").read_text())["task"] == "reward-model"
    assert {"accuracy", "margin", "loss"} <= set(s["eval"]) and s["eval"]["samples"] == 6
    model_dir = tmp_path / "rm" / "model"
    score = pipeline("text-classification", model=str(model_dir), function_to_apply="none")("Hello world.")
    assert score[0]["label"] == "score" and isinstance(score[0]["score"], float)
    texts = write_jsonl(tmp_path / "texts.jsonl", [{"text": w} for w in WORDS])
    assert main(["predict", str(model_dir), "--input", str(texts), "--output", str(tmp_path / "p.jsonl")]) == 0
    lines = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(lines) == len(WORDS) and all(isinstance(x["score"], float) for x in lines)
    assert lines[0]["score"] == pytest.approx(score[0]["score"], abs=1e-4)
    assert main(["eval", str(model_dir), f"data.eval={root / 'prefs_dev.jsonl'}", "--output",
                 str(tmp_path / "m.json")]) == 0
    got = json.loads((tmp_path / "m.json").read_text())["eval"]
    assert got["accuracy"] == pytest.approx(s["eval"]["accuracy"]) and got["samples"] == 6


def test_plan_prices_each_reference_choice(root, capsys):
    from leantrain.commands.plan import run_plan

    common = [f"model.name={root / 'llama'}", f"data.train={root / 'prefs.jsonl'}", "data.block_size=64",
              "train.batch_size=4"]
    r = run_plan(None, common, calibrate=False)
    pref = r["reference_choices"]
    assert pref["reference"] == "precompute" and set(pref["reference_options"]) == {"adapter", "precompute", "live",
                                                                                     "none"}
    assert pref["reference_options"]["live"]["extra_bytes"] == 4 * r["parameters"]  # a frozen fp32 copy
    assert pref["reference_options"]["precompute"]["extra_bytes"] == 0
    assert "* precompute" in capsys.readouterr().out
    live = run_plan(None, [*common, "preference.reference=live"], calibrate=False)  # its copy's no-grad forward
    assert live["reference_choices"]["reference"] == "live" and live["peak_bytes"] > r["peak_bytes"]


# ----------------------------------------------------------------- issue 35: what eval and predict read of the run


@pytest.fixture(scope="module")
def smoothed(root):
    """A DPO run whose loss settings differ from the defaults (label smoothing, beta), evaluated on prefs_dev."""
    assert main(args(root, "dpo-smoothed", "preference.label_smoothing=0.4", "preference.beta=5",
                     "train.eval_batch_size=8")) == 0
    return root / "dpo-smoothed"


def test_eval_uses_every_loss_setting_the_run_recorded(root, smoothed, tmp_path):
    """label_smoothing / beta (and KTO's weights) are recorded with the model; eval's loss on the run's eval data is
    the run's (probe 6: 0.833 against 0.742 when label smoothing was not recorded)."""
    recorded = json.loads((smoothed / "model" / "leantrain.json").read_text())["preference"]
    assert recorded["label_smoothing"] == 0.4 and recorded["beta"] == 5.0
    assert recorded["desirable_weight"] == recorded["undesirable_weight"] == 1.0
    assert "label smoothing 0.4" in (smoothed / "model" / "README.md").read_text()
    out = tmp_path / "m.json"
    assert main(["eval", str(smoothed / "model"), f"data.eval={root / 'prefs_dev.jsonl'}", "--output", str(out)]) == 0
    run_loss = summary(smoothed)["eval"]["loss"]
    assert json.loads(out.read_text())["eval"]["loss"] == pytest.approx(run_loss, rel=1e-4)


def test_kto_weights_are_recorded_and_used_by_eval(root, tmp_path):
    write_jsonl(root / "feedback_dev.jsonl", [{"prompt": r["prompt"], "completion": r["chosen" if i % 2 else
                                                "rejected"], "label": bool(i % 2)} for i, r in enumerate(pair_rows(6, 4))])
    assert main(args(root, "kto-weighted", f"data.train={root / 'feedback.jsonl'}",
                     f"data.eval={root / 'feedback_dev.jsonl'}", "preference.desirable_weight=3",
                     "preference.undesirable_weight=0.5", "train.eval_batch_size=8")) == 0
    run = root / "kto-weighted"
    recorded = json.loads((run / "model" / "leantrain.json").read_text())["preference"]
    assert (recorded["loss"], recorded["desirable_weight"], recorded["undesirable_weight"]) == ("kto", 3.0, 0.5)
    out = tmp_path / "m.json"
    assert main(["eval", str(run / "model"), f"data.eval={root / 'feedback_dev.jsonl'}", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["eval"]["loss"] == pytest.approx(summary(run)["eval"]["loss"], rel=1e-4)


def test_eval_refuses_feedback_for_a_pair_loss_as_train_does(root, smoothed, capsys):
    """probe 3: a DPO model evaluated on KTO feedback got a reward accuracy over (row, its KL row), labels ignored;
    train refuses the same combination (data.train: Task.check_data, which eval now applies to its rows; a data.eval
    of another kind than data.train: the data side)."""
    assert main(["eval", str(smoothed / "model"), f"data.eval={root / 'feedback.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "data.eval: unpaired feedback" in err and "preference.loss=dpo" in err
    assert main(args(root, "dpo-on-feedback", "preference.loss=dpo", f"data.train={root / 'feedback.jsonl'}")) == 2
    assert main(args(root, "dpo-feedback-eval", "preference.loss=dpo", f"data.eval={root / 'feedback.jsonl'}")) == 2
    assert "data.eval: feedback.jsonl: unpaired feedback" in capsys.readouterr().err


def test_a_reward_model_is_cut_at_one_length_by_train_predict_and_pipeline(root, tmp_path):
    """probe 5: training cut the rows at data.block_size while predict cut at the recorded data.max_length (128) and
    pipeline() at the tokenizer's 512: the run's length is recorded as max_length and as the tokenizer's
    model_max_length, and a text longer than it scores as its first data.block_size tokens."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    bert = make_tiny_bert(tmp_path / "bert", layers=1, hidden=16)
    assert main(["train", f"model.name={bert}", f"data.train={root / 'prefs.jsonl'}", "data.block_size=12",
                 "train.batch_size=4", "train.max_steps=1", "efficiency.precision=fp32", "report.plots=false",
                 "report.progress=none", "checkpoint.every_steps=0", f"output_dir={tmp_path / 'rm'}"]) == 0
    model_dir = tmp_path / "rm" / "model"
    assert json.loads((model_dir / "leantrain.json").read_text())["data"]["max_length"] == 12
    text = " ".join(WORDS * 4)  # far more than 12 tokens
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.model_max_length == 12
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    import torch

    with torch.no_grad():
        want = model(**tok(text, truncation=True, max_length=12, return_tensors="pt")).logits.item()
    texts = write_jsonl(tmp_path / "texts.jsonl", [{"text": text}])
    assert main(["predict", str(model_dir), "--input", str(texts), "--output", str(tmp_path / "p.jsonl")]) == 0
    assert json.loads((tmp_path / "p.jsonl").read_text())["score"] == pytest.approx(want, abs=1e-5)
    score = pipeline("text-classification", model=str(model_dir), function_to_apply="none")(text, truncation=True)
    assert score[0]["score"] == pytest.approx(want, abs=1e-5)
