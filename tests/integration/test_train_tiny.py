"""End-to-end runs on a tiny random BERT: the run folder, the summary's keys, the CLI's exit codes."""

import json
import subprocess
import sys

import pytest

from tests.helpers import shared_data, word_rows, write_rows
from leantrain import train
from leantrain.cli import main
from leantrain.report.logs import read_metrics

REVIEWS = {"max_words": 12, "columns": ("review", "stars")}  # rows with their own column names


@pytest.fixture
def files(tmp_path):
    return (write_rows(tmp_path / "train.csv", word_rows(120, **REVIEWS)),
            write_rows(tmp_path / "dev.csv", word_rows(40, seed=1, **REVIEWS)))


def test_run_folder_and_summary(tmp_path, tiny_bert, files):
    train_f, dev_f = files
    out = tmp_path / "run"
    summary = train(None, [f"model.name={tiny_bert}", f"data.train={train_f}", f"data.eval={dev_f}",
                           "data.text_column=review", "data.label_column=stars", "train.epochs=4",
                           "train.batch_size=16", "train.micro_batch_size=8", "train.lr=3e-3",
                           "train.log_every_steps=8", "train.eval_every_steps=16", f"output_dir={out}"])
    for f in ["config.yaml", "metrics.jsonl", "summary.json", "loss_curve.png", "model/config.json",
              "model/model.safetensors", "model/tokenizer.json", "model/README.md"]:
        assert (out / f).is_file(), f
    on_disk = json.loads((out / "summary.json").read_text())
    for path in ["eval.accuracy", "eval.f1_macro", "eval.loss", "eval.mcc", "train.steps", "train.samples_per_second",
                 "train.tokens_per_second", "train.peak_memory_bytes", "train.wall_seconds", "versions.torch",
                 "versions.transformers", "versions.accelerate"]:
        node = on_disk
        for part in path.split("."):
            node = node[part]
        assert node is not None, path
    assert on_disk["train"]["steps"] == 32 and summary["train"]["accumulation_steps"] == 2
    assert on_disk["train"]["peak_memory_bytes"] > 50e6
    assert summary["model"]["labels"] == ["neg", "pos"]  # sorted string labels
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records if r["type"] == "train"] == [8, 16, 24, 32]
    assert [r["step"] for r in records if r["type"] == "eval"] == [16, 32]
    assert summary["eval"]["accuracy"] > 0.8  # the words decide the label: even a tiny model learns it
    cfg = (out / "config.yaml").read_text()
    assert "lr: 0.003" in cfg and str(out) in cfg


def test_pipeline_and_predict_agree(tmp_path, tiny_bert, files):
    from transformers import pipeline

    train_f, dev_f = files
    out = tmp_path / "run"
    train(None, [f"model.name={tiny_bert}", f"data.train={train_f}", f"data.eval={dev_f}", "train.max_steps=6",
                 "data.text_column=review", "data.label_column=stars",
                 "train.lr=1e-3", f"output_dir={out}", "report.plots=false"])
    evals = [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["type"] == "eval"]
    assert evals == [4, 6]  # eval_every_steps=0: at each epoch's end (4 steps/epoch) and at the end
    preds = tmp_path / "preds.jsonl"
    assert main(["predict", str(out / "model"), "--input", str(dev_f), "--output", str(preds)]) == 0
    ours = [json.loads(line) for line in preds.read_text().splitlines()]
    texts = [r["review"] for r in word_rows(40, seed=1, **REVIEWS)]
    theirs = pipeline("text-classification", model=str(out / "model"), device="cpu")(texts)
    assert [o["label"] for o in ours] == [t["label"] for t in theirs]
    assert [o["score"] for o in ours] == pytest.approx([t["score"] for t in theirs], abs=1e-4)
    assert main(["eval", str(out / "model"), f"data.eval={dev_f}", "data.label_column=stars", "--output", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["eval"]["samples"] == 40


def test_bad_inputs_exit_2_before_any_model(tmp_path, capsys):
    assert main(["train", "train.lrr=1"]) == 2
    assert "did you mean 'train.lr'" in capsys.readouterr().err
    assert main(["train", f"data.train={tmp_path / 'nope.csv'}", f"output_dir={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert "nope.csv" in err and "data.train" in err
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_print_config_option_anywhere(capsys):
    assert main(["train", "train.lr=0.1", "--print-config", "train.seed=3"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.1" in out and "seed: 3" in out


def test_inspect_counts(tiny_bert, capsys):
    assert main(["inspect", str(tiny_bert), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    p = info["parameters"]
    assert p["total"] == p["trainable"] == p["embeddings"] + p["non_embedding"]
    assert p["embeddings"] >= 30522 * 32 and info["config"]["hidden_size"] == 32


def test_module_entry_point_help():
    r = subprocess.run([sys.executable, "-m", "leantrain", "train", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "train.micro_batch_size" in r.stdout and "examples:" in r.stdout
    description = r.stdout.split("\n\n")[1]  # after the usage line: what train does, languages models included
    assert description.startswith("Train or fine-tune a model") and "language model" in description


def test_text_pairs_autodetected(tmp_path, tiny_bert):
    dev = shared_data("mrpc", "dev.tsv")
    out = tmp_path / "run"
    summary = train(None, [f"model.name={tiny_bert}", f"data.train={dev}", "train.max_steps=2",
                           f"output_dir={out}", "report.plots=false"])
    assert summary["data"]["columns"]["text"] == "sentence1" and summary["data"]["columns"]["text_pair"] == "sentence2"
    assert summary["data"]["eval_rows"] == 41  # a seeded 10% hold-out of 408 rows


def test_stop_when_target_is_met(tmp_path, tiny_bert, files):
    train_f, dev_f = files
    out = tmp_path / "run"
    summary = train(None, [f"model.name={tiny_bert}", f"data.train={train_f}", f"data.eval={dev_f}",
                           "data.text_column=review", "data.label_column=stars", "train.max_steps=20",
                           "train.eval_every_steps=3", "train.stop_when=eval.loss<=100", f"output_dir={out}",
                           "report.plots=false"])
    assert summary["train"]["steps"] == 3
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["type"] == "eval"]
    assert [r["step"] for r in evals] == [3] and evals[0]["loop_seconds"] > 0


def test_tensorboard_tracker_is_opt_in(tmp_path, tiny_bert, files):
    train_f, dev_f = files
    out = tmp_path / "run"
    train(None, [f"model.name={tiny_bert}", f"data.train={train_f}", f"data.eval={dev_f}", "data.text_column=review",
                 "data.label_column=stars", "train.max_steps=4", "train.log_every_steps=2", "report.trackers=[tensorboard]",
                 f"output_dir={out}", "report.plots=false"])
    events = list(out.rglob("events.out.tfevents.*"))
    assert events, sorted(p.name for p in out.rglob("*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    assert {"train/loss", "eval/accuracy"} <= set(acc.Tags()["scalars"])
